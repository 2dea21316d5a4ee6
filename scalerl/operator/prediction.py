"""The prediction of a run in a cluster: fit `status.evaluations`, write `status.prediction`.

`scalerl fit --run NAME --namespace NS` (the fit Job) calls `fit_run`. A fit that cannot be made
(too few points past fit.minCompute, a flat curve) keeps the previous prediction and sets
Predicted=False with the reason. `stop_reason` is the prediction-driven stop the operator applies.
"""

from __future__ import annotations

from typing import Any

from scalerl.errors import DataError, FitError, InputError, ScaleRLError, SpecError
from scalerl.spec import BudgetSpec, parse_run
from scalerl.status.conditions import now_rfc3339, set_condition
from scalerl.status.kubernetes import RunStatus, round_value

PREDICTED = "Predicted"


def predict(
    evaluations: list[dict[str, Any]],
    *,
    min_compute: float,
    budget: BudgetSpec,
    units: int,
    **fit_options: Any,
) -> dict[str, Any]:
    """status.prediction from status.evaluations; FitError/DataError when no fit can be made.

    The fit, and the run's outlook (`scalerl.fit.outlook`): predictedAtBudget at the first budget
    it will hit and what an evaluation there will read (the curve's band widened by the last
    evaluation's standard error), computeToTarget, etaSeconds at `units` compute per hour,
    confidence and the half-run backtest it rests on.
    """
    from scalerl.fit import fit_curve  # late: scipy, only in the fit Job
    from scalerl.fit.backtest import backtest
    from scalerl.fit.outlook import outlook
    from scalerl.fit.points import standard_errors

    points = sorted(evaluations, key=lambda e: e["computeHours"])
    if not points:
        raise FitError("no evaluations yet")
    compute = [e["computeHours"] for e in points]
    pass_rate = [e["passRate"] for e in points]
    sigma = standard_errors(points, "passRateSE")
    result = fit_curve(compute, pass_rate, min_compute=min_compute, sigma=sigma, **fit_options)
    fitted = result.to_dict()
    interval = fitted["A_interval"]
    last = points[-1]
    end = outlook(
        result,
        budget,
        step=int(last["step"]),
        compute=float(last["computeHours"]),
        units=units,
        observation_se=float(last.get("passRateSE") or 0.0),
        backtest=backtest(compute, pass_rate, sigma=sigma, min_compute=min_compute, **fit_options),
    )
    return {
        "A": round_value(fitted["A"]),
        "B": round_value(fitted["B"]),
        "C_mid": round_value(fitted["C_mid"]),
        "R0": round_value(fitted["R0"]),
        "A_interval": None if interval is None else [round_value(v) for v in interval],
        **_rounded(end),
        "points": int(fitted["points"]),
        "evaluations": len(points),
        "fittedAt": now_rfc3339(),
    }


def _rounded(value: Any) -> Any:
    """Every number in `value` (nested in lists and dicts) rounded for the status."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return round_value(value) if isinstance(value, float) else value


def describe(prediction: dict[str, Any]) -> str:
    interval = prediction.get("A_interval")
    band = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
    return (
        f"A={prediction['A']:.3f}{band} C_mid={prediction['C_mid']:.4g} "
        f"B={prediction['B']:.2f} from {prediction['points']} points past fit.minCompute of "
        f"{prediction['evaluations']} in status.evaluations; "
        f"{prediction['predictedAtBudget']:.3f} predicted at the run's end "
        f"({prediction['budgetLimit']}, compute {prediction['budget']:.4g})"
        f"{misfit_note(prediction)}"
    )


def misfit_note(fit: dict[str, Any]) -> str:
    """What a Misfit confidence means for this fit ('' for any other), to add to its summary."""
    test = fit.get("backtest")
    if fit.get("confidence") != "Misfit" or not test or not test.get("interval"):
        return ""
    lo, hi = test["interval"]
    return (
        f"; Misfit: fitted on the first half of the compute, the law predicted "
        f"{test['predicted']:.3f} [{lo:.3f}, {hi:.3f}] for the last evaluation, which read "
        f"{test['actual']:.3f}: the run is not following the law yet, and its intervals are "
        f"too narrow"
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
        prediction = _predict_run(run, min_compute, options)
        ok, reason, message = True, "Fitted", describe(prediction)
    except (FitError, DataError, InputError) as err:
        ok, reason, message = False, _reason(err), str(err)

    def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
        fields = _conditions(fresh, ok, reason, message) or {}
        return {**fields, "prediction": prediction} if prediction else fields or None

    status.update(change)
    return prediction


def _predict_run(
    run: dict[str, Any], min_compute: float | None, options: dict[str, Any]
) -> dict[str, Any]:
    spec = parse_run(run).spec  # a run whose spec no longer parses gets no fit (SpecError)
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


def stop_reason(budget: BudgetSpec, prediction: dict[str, Any] | None) -> str | None:
    """Why the run should stop now (spec.budget.stopWhen), or None.

    Only when the whole A interval lies below the target: a point estimate below it is not
    enough evidence to throw away the compute already spent.
    """
    rule = budget.stop_when
    if rule is None or not prediction:
        return None
    interval = prediction.get("A_interval")
    if interval is None or prediction.get("points", 0) < rule.min_points:
        return None
    if interval[1] >= rule.predicted_a_below:
        return None
    return (
        f"predicted A interval [{interval[0]:.3f}, {interval[1]:.3f}] from "
        f"{prediction['points']} points lies below stopWhen.predictedABelow "
        f"{rule.predicted_a_below}"
    )
