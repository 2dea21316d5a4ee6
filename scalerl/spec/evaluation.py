"""Held-out evaluations (what the scaling law is fitted to), the fit's schedule, and the bounds and
confidence words of a prediction."""

from __future__ import annotations

from pydantic import Field

from scalerl.spec.base import MAX_STEPS, Float, Int, _Model


class EvaluationSpec(_Model):
    """Held-out evaluations: the pass rates the scaling law is fitted to."""

    every_steps: Int = Field(
        100,
        ge=1,
        le=MAX_STEPS,
        description="Evaluate held-out prompts every N steps (ppo-off-policy-k: once after a "
        "round of k steps that a multiple of N falls in, on the weights it ends with).",
    )
    generations_per_prompt: Int = Field(16, ge=1, le=1024, description="k of mean@k; paper 16.")
    log_completions: Int = Field(
        0,
        ge=0,
        le=1024,
        description="Completions of each evaluation written to the run's "
        "evaluations/step-N.completions.jsonl for a person to read (prompt, completion, "
        "answer, reward); 0: none.",
    )


def evaluation_steps(max_steps: int, every_steps: int, round_steps: int = 1) -> list[int]:
    """The steps a run to max_steps evaluates at: step 0; the end of each round of round_steps
    steps (PPO-off-policy-k's k, the last round cut at max_steps; 1 otherwise) that a multiple
    of every_steps falls in, on the weights the round ends with; and the last step."""
    steps = [0]
    for start in range(0, max_steps, round_steps):
        end = min(start + round_steps, max_steps)
        if end // every_steps > start // every_steps:
            steps.append(end)
    if steps[-1] != max_steps:
        steps.append(max_steps)
    return steps


class FitSpec(_Model):
    """The sigmoidal law's fit: how often, and over which evaluations."""

    every_evaluations: Int = Field(
        5, ge=1, le=10_000, description="Refit after this many new evaluations."
    )
    min_compute: Float | None = Field(
        None,
        ge=0,
        le=1e9,
        description="Exclude points below this compute (the run's unit: GPU-hours, or "
        "process-hours for a CPU run); null: 3 % of the largest compute so far, as the paper's "
        "~1.5k of 50k GPU-hours.",
    )


# Points past the compute floor a prediction needs before it is more than "too early": the
# paper fits dozens; with fewer, an extrapolation of three shape parameters rests on too little.
PREDICTION_MIN_POINTS = 8
# The fewest points past the floor the fitter fits at all (scalerl.fit.fitter.MIN_POINTS).
FIT_MIN_POINTS = 4
# A prediction's confidence (scalerl.fit.outlook says when each applies); one word each: a
# kubectl column splits on spaces.
TOO_EARLY, UNCHECKED, MISFIT, OK = "TooEarly", "Unchecked", "Misfit", "OK"
# The law's own half-run check (scalerl.fit.decision.law_check), apart from the forecast's.
LAW_HOLDS, LAW_MISSES = "Holds", "Misses"
# What each word means, defined once: the CRD's descriptions and docs/predictions.md read these.
CONFIDENCE_DESCRIPTION = (
    f"Whether the forecast shown (predictedAtBudget and its interval) passed its half-run "
    f"check. {TOO_EARLY} while fewer than {PREDICTION_MIN_POINTS} trained evaluations lie past "
    f"fit.minCompute: the numbers rest on too little. {UNCHECKED} while the half-run check "
    f"cannot run (the first half of the compute holds fewer than {PREDICTION_MIN_POINTS} such "
    f"evaluations). {MISFIT} when the forecast made from the first half (law and drift, as "
    f"shown now) missed the last evaluation with its interval: its intervals did not hold on "
    f"this run. {OK} only when that check ran and held. Whether the run follows the law alone "
    f"is lawCheck."
)
LAW_CHECK_DESCRIPTION = (
    f"Whether the run follows the law alone: {LAW_HOLDS} when the first half's law, without "
    f"any drift, held the last evaluation within its own interval; {LAW_MISSES} when it did "
    f"not (the forecast may still hold, by the drift: confidence says); null while the "
    f"half-run check cannot run."
)
