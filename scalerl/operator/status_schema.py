"""The ScaleRLRun status schema of its CRD (structural OpenAPI v3, written by hand: the status is
the operator's and the processes', not the user's), the run's phases, and the field builders
the ScaleRLSweep's status schema (`scalerl.operator.sweep_schema`) shares."""

from __future__ import annotations

from typing import Any

from scalerl import spec as _spec
from scalerl.metrics import COMPUTE_UNIT
from scalerl.status.history import MAX_UNSCORED_FRACTION

PHASES = (
    "Pending",
    "Initializing",
    "Queued",
    "Starting",
    "Running",
    "Suspended",
    "Succeeded",
    "Failed",
)
# At most this many evaluations stay in the status (etcd refuses objects over 1.5 MiB; about 100
# bytes each). The sink thins to EVALUATIONS_KEPT; the schema leaves room above it.
EVALUATIONS_KEPT = 300
EVALUATIONS_MAX = 1000


def number(description: str, **bounds: Any) -> dict[str, Any]:
    return {"type": "number", "description": description, **bounds}


def _int(description: str) -> dict[str, Any]:
    return {"type": "integer", "description": description, "minimum": 0}


def interval(description: str) -> dict[str, Any]:
    return {
        "type": "array",
        "description": description,
        "items": {"type": "number"},
        "minItems": 2,
        "maxItems": 2,
        "nullable": True,
    }


def conditions() -> dict[str, Any]:
    return {
        "type": "array",
        "items": _condition(),
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    }


def _condition() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {
                "type": "string",
                "description": "Ready, PodsReady, Suspended, Predicted, LearningSignal or Stopped.",
            },
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string", "description": "CamelCase reason."},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "minimum": 0},
        },
    }


def _progress() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Live progress, patched by trainer 0 after every step.",
        "properties": {
            "step": _int("Optimizer steps taken."),
            "policyVersion": _int("Version of the weights generators sample with."),
            "maxSteps": _int("spec.budget.maxSteps as the trainer read it."),
            "computeHours": number(f"Compute spent ({COMPUTE_UNIT}; suspended time excluded)."),
            "evalPassRate": number(
                "Held-out mean@k pass rate of the last evaluation.", nullable=True
            ),
            "trainPassRate": number(
                "Pass rate of the last training batch (reward > 0 and not truncated)."
            ),
            "truncationRate": number("Fraction of the last batch's samples cut at the budget."),
            "entropy": number("Mean token entropy of the last trained batch."),
            "policyLag": number("Mean policy lag (steps) of the last trained batch's tokens."),
            "updatedAt": {"type": "string", "format": "date-time"},
        },
    }


def _evaluations() -> dict[str, Any]:
    return {
        "type": "array",
        "description": f"Held-out evaluations, at most about {EVALUATIONS_KEPT} (thinned evenly on "
        "log compute; the full history is history.jsonl on the checkpoint volume).",
        "maxItems": EVALUATIONS_MAX,
        "items": {
            "type": "object",
            "required": ["step", "computeHours", "passRate"],
            "properties": {
                "step": _int("Step of the evaluation."),
                "computeHours": number(f"Compute at the evaluation ({COMPUTE_UNIT})."),
                "passRate": number(
                    "Held-out mean@k pass rate: correct / (prompts x k), a sample that could "
                    "not be scored counted as not passed."
                ),
                "passRateSE": number("Standard error of passRate, from the per-prompt means."),
                "samples": _int("Held-out samples asked for (prompts x k), scored or not."),
                "unscored": _int(
                    "Held-out samples that could not be scored (counted as not passed); absent "
                    "for none."
                ),
                "unscoredReasons": {
                    "type": "object",
                    "description": "unscored by reason: sandbox (the code sandbox itself "
                    "failed), reward_error (the reward function or rubric raised), "
                    "rollout_failed (the environment failed the rollout).",
                    "maxProperties": 8,
                    "additionalProperties": {"type": "integer"},
                },
                "fitExcluded": {
                    "type": "string",
                    "description": "Why the fit leaves this evaluation out (more than "
                    f"{MAX_UNSCORED_FRACTION:.0%} of its samples unscored); absent when it is "
                    "fitted.",
                },
                "time": _int(
                    "Unix time (seconds) the evaluation ended: with computeHours, the run's "
                    "wall pace (prediction.etaSeconds)."
                ),
                "truncationRate": number("Fraction of held-out samples cut at the budget."),
                "byDomain": _domains(
                    "A run of several domains (spec.data.train as sources): each domain's "
                    "held-out pass rate at this evaluation; absent for one domain.",
                    {
                        "passRate": number("Mean@k over this domain's held-out prompts."),
                        "passRateSE": number("Standard error of passRate."),
                        "samples": _int("This domain's held-out samples scored."),
                    },
                ),
            },
        },
    }


def _domains(description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """A map domain name -> object, at most MAX_DOMAINS of them (the status stays small)."""
    return {
        "type": "object",
        "description": description,
        "maxProperties": _spec.MAX_DOMAINS,
        "additionalProperties": {"type": "object", "properties": properties},
    }


def _prediction() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "The sigmoidal scaling law fitted to status.evaluations by the fit Job.",
        "properties": {
            "A": number("Asymptotic pass rate."),
            "B": number("Scaling exponent (compute efficiency)."),
            "C_mid": number(f"Compute ({COMPUTE_UNIT}) at half of the gain from R0 to A."),
            "R0": number("Pass rate at the start."),
            "A_interval": interval(
                "Profile-likelihood interval of A: every A whose best curve fits the points "
                "within the 95 % likelihood-ratio threshold."
            ),
            "A_atLeast": number(
                "A lower bound of A where the points bound it from below only (the curve has "
                "not bent yet: C_mid beyond the data); null otherwise.",
                nullable=True,
            ),
            "predictedAtBudget": number(
                "The forecast where the run will end (at the first budget it will hit): the "
                "law there, moved by as much of the run's measured drift from it as the run's "
                "own earlier fits support (forecast). Every decision reads it: stopWhen, "
                "computeToTarget, etaSeconds."
            ),
            "predictedAtBudgetInterval": interval(
                "What an evaluation at the run's end will read: the band of the curves the "
                "points allow there, widened by the drift's uncertainty and by one evaluation's "
                "noise at that pass rate; never narrower further out, never a point."
            ),
            "forecast": {
                "type": "object",
                "description": "Which model predictedAtBudget is and why: model (law, or "
                "law+drift where the run's earlier fits kept missing its later evaluations in "
                "one direction beyond their own intervals), weight (the drift's share, 0-1), "
                "evidence (origins: the latest earlier fits judged; compared: the later "
                "evaluations they were judged at; above, below: how many lay outside their "
                "intervals on each side; null: fewer than two earlier fits, the law alone).",
                "properties": {
                    "model": {"type": "string", "enum": ["law", "law+drift"]},
                    "weight": number("The drift's share of the forecast, 0-1."),
                    "evidence": {
                        "type": "object",
                        "nullable": True,
                        "properties": {
                            name: {"type": "integer"}
                            for name in ("origins", "compared", "above", "below")
                        },
                    },
                },
            },
            "forecastNotes": {
                "type": "array",
                "description": "What the numbers cannot carry: AboveA (the forecast reads "
                "above A's interval: the drift carries it past the law's ceiling), "
                "BeyondEvidence (the budget lies more than 3x the fitted compute, past what "
                "the calibration evidence covers), SaysNothing (the interval spans [0, 1]).",
                "items": {"type": "string", "enum": ["AboveA", "BeyondEvidence", "SaysNothing"]},
            },
            "reach": number("The budget's compute over the last fitted compute."),
            "budgetSet": _budget_set(
                "The budget as set when the prediction was made (maxSteps, maxComputeHours): "
                "the track record scores a prediction only against a run that ended under the "
                "same one."
            ),
            "lawCheck": {
                "type": "string",
                "nullable": True,
                "description": _spec.LAW_CHECK_DESCRIPTION,
            },
            "drift": {
                "type": "object",
                "nullable": True,
                "description": "How far the run's own earlier fits (rolling origins) missed "
                "where it went, per unit of ln compute beyond the data, in the logit of the pass "
                "rate: rate (added to the law's logit), "
                "spread and rateSe (the interval's widening), origins (prefix fits measured); "
                "null with fewer than two.",
                "properties": {
                    "rate": number(
                        "Logit of the pass rate gained over the law per unit of ln compute."
                    ),
                    "spread": number("Scatter of that gain per unit of ln compute."),
                    "rateSe": number("Standard error of the rate."),
                    "origins": {"type": "integer", "description": "Prefix fits measured."},
                },
            },
            "budget": number(
                f"The compute where the run will end ({COMPUTE_UNIT}): maxComputeHours, or "
                "the compute maxSteps will have taken at the run's compute per step so far."
            ),
            "budgetLimit": {
                "type": "string",
                "enum": ["maxSteps", "maxComputeHours"],
                "description": "The budget the run will hit first.",
            },
            "computeToTarget": number(
                f"Compute ({COMPUTE_UNIT}) at which the forecast (predictedAtBudget's) reaches "
                "budget.targetPassRate and stays at or above it up to the budget; where it is "
                "below the target at the budget, where it reaches it past the budget, up to 3x "
                "the last fitted compute; 0 where it starts there, null where it does not get "
                "there or without a target.",
                nullable=True,
            ),
            "etaSeconds": {
                "type": "object",
                "description": "Seconds from the last evaluation: wall seconds at the run's "
                "measured pace (the median wall time per unit of compute between its "
                "evaluations, which counts evaluations and restarts too); where evaluations "
                "carry no time, training seconds at the run's GPUs.",
                "properties": {
                    "budget": number(
                        "To the run's end (predictedAtBudget's compute).", nullable=True
                    ),
                    "target": number(
                        "To computeToTarget (null when there is none or it lies beyond the "
                        "budget: the run will not get there).",
                        nullable=True,
                    ),
                },
            },
            "confidence": {
                "type": "string",
                "enum": [_spec.TOO_EARLY, _spec.UNCHECKED, _spec.MISFIT, _spec.OK],
                "description": _spec.CONFIDENCE_DESCRIPTION,
            },
            "confidenceReason": {
                "type": "string",
                "nullable": True,
                "description": "Why the confidence is not OK, in words (null when OK).",
            },
            "backtest": {
                "type": "object",
                "nullable": True,
                "description": "The fit of the evaluations in the first half of the compute, "
                "asked what the last evaluation would read (null until that half holds "
                f"{_spec.PREDICTION_MIN_POINTS} trained evaluations past fit.minCompute and "
                "can be fitted).",
                "properties": {
                    "fittedOn": _int("Evaluations at compute up to half the last one's."),
                    "compute": number(f"The last evaluation's compute ({COMPUTE_UNIT})."),
                    "predicted": number(
                        "The first half's forecast there (law and drift, as predictedAtBudget)."
                    ),
                    "interval": interval(
                        "What an evaluation there would read, by the first half's forecast."
                    ),
                    "actual": number("What the last evaluation read."),
                    "error": number("predicted - actual."),
                    "inside": {
                        "type": "boolean",
                        "nullable": True,
                        "description": "Whether actual lies in interval (null without one).",
                    },
                    "law": {
                        "type": "object",
                        "description": "The first half's law alone there (lawCheck's).",
                        "properties": {
                            "predicted": number("The law's value there.", nullable=True),
                            "interval": interval("The law's own interval there."),
                            "inside": {"type": "boolean", "nullable": True},
                        },
                    },
                },
            },
            "points": _int(
                "Trained evaluations the fit used: past fit.minCompute, not the step-0 one "
                "(compute 0, which sets R0)."
            ),
            "evaluations": _int(
                "Evaluations the fit read: status.evaluations, thinned evenly on log compute."
            ),
            "fittedAt": {"type": "string", "format": "date-time"},
            "domains": _domains(
                "A run of several domains: the law fitted to each domain's pass rates alone "
                "(evaluations[].byDomain), as the paper fits its math+code run; a domain whose "
                "fit cannot be made says why (error). Absent for one domain.",
                {
                    "A": number("Asymptotic pass rate of this domain."),
                    "B": number("Scaling exponent of this domain."),
                    "C_mid": number(f"Compute midpoint of this domain ({COMPUTE_UNIT})."),
                    "R0": number("This domain's pass rate at the start."),
                    "A_interval": interval("Profile-likelihood interval of this domain's A."),
                    "A_atLeast": number(
                        "Where this domain's points bound A from below only, that bound.",
                        nullable=True,
                    ),
                    "predictedAtBudget": number("This domain's forecast where the run will end."),
                    "confidence": {"type": "string", "description": "As the run's, per domain."},
                    "points": _int("This domain's evaluations the fit used."),
                    "error": {"type": "string", "description": "Why no fit could be made."},
                },
            ),
            "A_byDomain": {
                "type": "string",
                "description": "Each domain's A in one line (e.g. code=0.62 math=0.59; "
                "code>=0.6 where the points bound it from below only, code=- where no fit "
                "was made), for kubectl get -o wide. Absent for one domain.",
            },
        },
    }


def _budget_set(description: str) -> dict[str, Any]:
    """A budget as set (`scalerl.fit.outlook.budget_set`); an unset limit is left out."""
    return {
        "type": "object",
        "description": description,
        "properties": {
            "maxSteps": number("spec.budget.maxSteps."),
            "maxComputeHours": number("spec.budget.maxComputeHours."),
        },
    }


def _track_record() -> dict[str, Any]:
    """status.trackRecord (scalerl.operator.trackrecord)."""
    score = {
        "actual": number("The run's last evaluation (outcome.passRate)."),
        "actualCompute": number(f"Its compute ({COMPUTE_UNIT})."),
        "error": number("predictedAtBudget - actual (null where void or censored).", nullable=True),
        "inside": {
            "type": "boolean",
            "nullable": True,
            "description": "Whether actual lies in predictedAtBudgetInterval (null without "
            "one, or where void or censored).",
        },
        "width": number("The width of predictedAtBudgetInterval.", nullable=True),
        "void": {
            "type": "boolean",
            "description": "Made for another budget than the run ended under (the spec's "
            "budget was changed): neither a hit nor a miss; error and inside are null.",
        },
        "voidReason": {"type": "string", "description": "Which budget it was made for."},
        "censored": {
            "type": "boolean",
            "description": "The run was stopped by its prediction (budget.stopWhen) and never "
            "reached its budget: counted apart, with what it read when stopped (actual); "
            "error and inside are null.",
        },
        "censoredReason": {"type": "string", "description": "Why the run was stopped."},
    }
    kept = {
        "seen": number(
            "The fraction of the run this prediction stands for: the latest made by it."
        ),
        "fractionSeen": number(
            "The fraction of the run seen when it was made: compute then over the budget's "
            "compute the run was heading for then."
        ),
        "compute": number(f"Compute of the last evaluation it fitted ({COMPUTE_UNIT})."),
        "step": _int("Step of that evaluation."),
        "A": number("Asymptotic pass rate then."),
        "A_interval": interval("Interval of A then."),
        "A_atLeast": number(
            "Lower bound of A then, where the data bound it from below only.", nullable=True
        ),
        "predictedAtBudget": number("What it predicted the run would end at."),
        "predictedAtBudgetInterval": interval("What an evaluation at the end would read, then."),
        "confidence": {"type": "string", "description": "The prediction's confidence then."},
        "budgetSet": _budget_set("The budget it was made for."),
        **score,
    }
    return {
        "type": "object",
        "description": "How good the run's predictions were: the prediction that was the latest "
        "made by 25, 50 and 75 % of the run, scored against its last evaluation once it has "
        "Succeeded or was stopped by its prediction (the operator's track record metrics pool "
        "them).",
        "properties": {
            "predictions": {
                "type": "array",
                "maxItems": 3,
                "items": {"type": "object", "properties": kept},
            },
            "outcome": {
                "type": "object",
                "nullable": True,
                "description": "Where the run ended (absent until it has Succeeded or was "
                "stopped by its prediction).",
                "properties": {
                    "passRate": number("Its last evaluation."),
                    "computeHours": number(f"Its compute ({COMPUTE_UNIT})."),
                    "budgetSet": _budget_set("The budget it ended under."),
                    "stopped": {
                        "type": "string",
                        "description": "Why budget.stopWhen stopped it (absent: it ran to "
                        "its budget).",
                    },
                },
            },
        },
    }


def _sources() -> dict[str, Any]:
    """status.sources: what the initializer Job resolved (scalerl.fetch; sources.json's
    records)."""
    text = {"type": "string"}
    texts = {"type": "array", "items": text}
    return {
        "type": "array",
        "description": "The hf:// sources as the initializer Job resolved them: each field's "
        "id, the commit its revision named, and the local files on the claim the pods load.",
        "items": {
            "type": "object",
            "required": ["field", "uri", "commit", "path"],
            "properties": {
                "field": {**text, "description": "The spec field (model.path, data.train[0])."},
                "uri": {**text, "description": "The hf:// id as the spec names it."},
                "kind": {"type": "string", "enum": ["model", "dataset"]},
                "repo": text,
                "revision": {**text, "description": "The revision the id names (main)."},
                "commit": {**text, "description": "The commit every process loads."},
                "path": {**text, "description": "The snapshot folder (a model's folder)."},
                "files": {**texts, "description": "A dataset's files, in order."},
                "split": {**text, "nullable": True},
                "dataFiles": texts,
            },
        },
    }


def _generators() -> dict[str, Any]:
    failure = {
        "type": "object",
        "properties": {
            "pod": {"type": "string", "description": "The generator's pod that failed."},
            "nth": _int("Its index's failures before it (0: the index's first pod)."),
            "step": _int("The trainer's step when it failed (status.progress.step)."),
        },
    }
    return {
        "type": "object",
        "description": "The generator pool (not for a colocated run): a generator that fails "
        "is replaced alone while the trainer trains on (no gang restart).",
        "properties": {
            "desired": _int("spec.generators.replicas."),
            "ready": _int("Generator pods of the current gang running now."),
            "replaced": _int(
                "Generators replaced alone so far in this run (each with a GeneratorReplaced "
                "Event)."
            ),
            "failures": {
                "type": "object",
                "description": "The current gang's last failure of each generator, by index: a "
                "generator that fails again before the trainer trained a step since then "
                "restarts the gang.",
                "additionalProperties": failure,
            },
        },
    }


def status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Written by the operator, trainer 0 (progress, evaluations) and fit Jobs.",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES)},
            "message": {"type": "string", "description": "Why the run is in its phase."},
            "observedGeneration": _int("metadata.generation the operator last acted on."),
            "restarts": _int("Gang restarts from a checkpoint so far (the attempt number)."),
            "startupRestarts": _int(
                "Of the restarts, those of gangs that failed while starting (not counted "
                "against failurePolicy.maxRestarts)."
            ),
            "startingSince": {
                "type": "string",
                "format": "date-time",
                "description": "When the first gang since the run last ran was created (the "
                "startup timeout counts from it).",
            },
            "generators": _generators(),
            "generatorsGivenUp": _given_up(),
            "conditions": conditions(),
            "progress": _progress(),
            "evaluationCount": _int("Evaluations made (status.evaluations may be thinned)."),
            "evaluations": _evaluations(),
            "prediction": _prediction(),
            "trackRecord": _track_record(),
            "sources": _sources(),
            "fit": {
                "type": "object",
                "description": "Fit Jobs the operator created.",
                "properties": {
                    "jobs": _int("Fit Jobs created so far."),
                    "evaluations": _int("evaluationCount when the last fit Job was created."),
                },
            },
        },
    }


def _given_up() -> dict[str, Any]:
    return {
        "type": "array",
        "description": "Generators trainer 0 gave up while their pods ran (no rollouts for the "
        "peer timeout while the others sent theirs, or not joining the weight-sync group): the "
        "operator deletes each pod (a GeneratorGivenUp Event), its Job replaces it, and the "
        "entry goes.",
        "items": {
            "type": "object",
            "properties": {
                "index": _int("The generator's index."),
                "pod": {"type": "string", "description": "Its pod, as it said hello."},
                "reason": {"type": "string", "description": "Why trainer 0 gave it up."},
            },
        },
    }
