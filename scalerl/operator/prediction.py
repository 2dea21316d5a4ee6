"""The prediction of a run in a cluster: fit `status.evaluations`, write `status.prediction`.

`scalerl fit --run NAME --namespace NS` (the fit Job) calls `fit_run`. A fit that cannot be made
(too few points past fit.minCompute, a flat curve) keeps the previous prediction and sets
Predicted=False with the reason. The decisions a prediction drives (the stop rule, the target,
the confidence words) are `scalerl.fit.decision`'s, shared with `scalerl run`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scalerl.errors import DataError, FitError, InputError, ScaleRLError, SpecError
from scalerl.operator.trackrecord import TRACK_RECORD, with_prediction
from scalerl.spec import BudgetSpec, RunSpec, parse_run
from scalerl.status.conditions import now_rfc3339, set_condition
from scalerl.status.kubernetes import RunStatus, round_value

PREDICTED = "Predicted"


def predict(
    evaluations: list[dict[str, Any]],
    *,
    min_compute: float | None,
    budget: BudgetSpec,
    units: int,
    on_report: Callable[[dict[str, Any]], None] | None = None,
    **fit_options: Any,
) -> dict[str, Any]:
    """status.prediction from status.evaluations; FitError/DataError when no fit can be made.
    `on_report` is handed the whole fit as fit.json has it (the fit Job's trackers take it).

    The fit and the run's outlook, as fit.json has them (`scalerl.fit.report.fit_report`):
    predictedAtBudget and what an evaluation there will read, computeToTarget, etaSeconds,
    confidence and the half-run backtest it rests on.
    """
    from scalerl.fit.domains import a_by_domain  # late: scipy, only in the fit Job
    from scalerl.fit.points import STATUS
    from scalerl.fit.report import fit_report

    points = sorted(evaluations, key=lambda e: e["computeHours"])
    if not points:
        raise FitError("no evaluations yet")
    options = {"min_compute": min_compute, "budget": budget, "units": units, **fit_options}
    fitted = fit_report(points, columns=STATUS, **options)
    if on_report is not None:
        on_report(fitted.to_dict())
    result = fitted.result.to_dict()
    prediction = {
        **{key: _rounded(result[key]) for key in _FIT_KEYS if key in result},
        **_rounded(fitted.outlook),
        "points": int(result["points"]),
        "evaluations": len(points),
        "fittedAt": now_rfc3339(),
    }
    domains = _domains(points, options)
    if domains:
        prediction["domains"] = domains
        prediction["A_byDomain"] = a_by_domain(domains)
    return prediction


# A domain's numbers status.prediction.domains carries (bounded: at most MAX_DOMAINS of them).
_DOMAIN_KEYS = (
    "A",
    "B",
    "C_mid",
    "R0",
    "A_interval",
    "A_atLeast",
    "predictedAtBudget",
    "confidence",
)


def _domains(points: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    """Each domain's fit of its own pass rates (`scalerl.fit.domains`), its main numbers only;
    {} for a run of one domain."""
    from scalerl.fit.domains import fit_domains
    from scalerl.fit.points import STATUS
    from scalerl.fit.report import fit_report

    out: dict[str, Any] = {}
    for domain, fitted in fit_domains(points, fit_report, STATUS, **options).items():
        if isinstance(fitted, str):
            out[domain] = {"error": fitted}
            continue
        numbers = {**fitted.result.to_dict(), **fitted.outlook}
        kept = {key: _rounded(numbers[key]) for key in _DOMAIN_KEYS if key in numbers}
        out[domain] = {**kept, "points": int(numbers["points"])}
    return out


# The fit's numbers status.prediction carries (fit.json has them all).
_FIT_KEYS = ("A", "B", "C_mid", "R0", "A_interval", "A_atLeast", "drift", "forecast")


def _rounded(value: Any) -> Any:
    """Every number in `value` (nested in lists and dicts) rounded for the status."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return round_value(value) if isinstance(value, float) else value


def describe(prediction: dict[str, Any], unit: str = "") -> str:
    """The Predicted condition's message: the law, where the run ends (compute in `unit`), and
    what is known of the fit (its confidence, and why when it is not OK)."""
    from scalerl.fit.decision import confidence_note, law_words, misfit_note, notes_words

    interval = prediction.get("A_interval")
    band = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
    at_least = prediction.get("A_atLeast")
    bound = f" (A >= {at_least:.3f}: the points bound it from below only)" if at_least else ""
    unit = f" {unit}" if unit else ""
    return (
        f"A={prediction['A']:.3f}{band}{bound} C_mid={prediction['C_mid']:.4g}{unit} "
        f"B={prediction['B']:.2f} from {prediction['points']} trained evaluations past "
        f"fit.minCompute of {prediction['evaluations']} in status.evaluations; "
        f"{prediction['predictedAtBudget']:.3f} predicted at the run's end "
        f"({prediction['budgetLimit']}, compute {prediction['budget']:.4g}{unit})"
        f"{notes_words(prediction)}{confidence_note(prediction)}{misfit_note(prediction)}"
        f"{law_words(prediction)}"
    )


def fit_run(status: RunStatus, min_compute: float | None = None, **options: Any) -> dict[str, Any]:
    """Fit the run's evaluations and record the outcome; the prediction, or {} when none.

    The fit runs outside the read-modify-write of the status: trainer 0 patches progress every
    step, and a write that waited for a bootstrap would lose its precondition again and again.
    Raises KubeError when the run cannot be read or written.
    """
    run = status.read()
    prediction: dict[str, Any] = {}
    try:
        spec = parse_run(run).spec  # a run whose spec no longer parses gets no fit (SpecError)
        prediction = _predict_run(run, spec, min_compute, options)
        ok, reason, message = True, "Fitted", describe(prediction, spec.compute_unit)
    except (FitError, DataError, InputError) as err:
        ok, reason, message = False, _reason(err), str(err)

    def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
        fields = _conditions(fresh, ok, reason, message) or {}
        if not prediction:
            return fields or None
        return {**fields, "prediction": prediction, **_kept(fresh, prediction, run)}

    status.update(change)
    return prediction


def _kept(
    fresh: dict[str, Any], prediction: dict[str, Any], fitted: dict[str, Any]
) -> dict[str, Any]:
    """status.trackRecord with the prediction kept (`scalerl.operator.trackrecord`), from the
    evaluations of the run as the fit read it (`fitted`)."""
    old = (fresh.get("status") or {}).get(TRACK_RECORD)
    evaluations = (fitted.get("status") or {}).get("evaluations") or []
    record = with_prediction(old, prediction, evaluations)
    return {TRACK_RECORD: record} if record is not None else {}


def _predict_run(
    run: dict[str, Any], spec: RunSpec, min_compute: float | None, options: dict[str, Any]
) -> dict[str, Any]:
    evaluations = (run.get("status") or {}).get("evaluations") or []
    floor = spec.fit.min_compute if min_compute is None else min_compute
    return predict(
        evaluations,
        min_compute=floor,
        budget=spec.budget,
        units=spec.cluster_compute_units,
        **options,
    )


def _conditions(run: dict[str, Any], ok: bool, reason: str, message: str) -> dict[str, Any] | None:
    current = list((run.get("status") or {}).get("conditions") or [])
    updated = set_condition(current, PREDICTED, ok, reason, message)
    return None if updated == current else {"conditions": updated}


def _reason(err: ScaleRLError) -> str:
    return "InvalidSpec" if isinstance(err, SpecError) else "FitFailed"
