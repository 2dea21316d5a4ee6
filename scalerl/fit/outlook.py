"""Where a fitted run is heading, in numbers a user can act on: the pass rate it will end at, the
compute at which it reaches its target, how long each is away, and whether there are enough
points to say any of it and the run is following the law (`scalerl.fit.backtest`)."""

from __future__ import annotations

from typing import Any

from scalerl.fit.backtest import Backtest
from scalerl.fit.law import compute_to_reach
from scalerl.fit.result import FitResult
from scalerl.spec import PREDICTION_MIN_POINTS, BudgetSpec

# One word each: a kubectl column splits on spaces.
TOO_EARLY, UNCHECKED, MISFIT, OK = "TooEarly", "Unchecked", "Misfit", "OK"


def outlook(
    result: FitResult,
    budget: BudgetSpec,
    *,
    step: int,
    compute: float,
    units: int,
    observation_se: float = 0.0,
    backtest: Backtest | None = None,
) -> dict[str, Any]:
    """The run's outlook from `result`, for a run at `step` having spent `compute`, whose
    compute grows by `units` per wall hour (its GPUs; processes locally).

    - predictedAtBudget: the curve where the run will end (the first budget it hits, `budget`,
      named by `budgetLimit`); predictedAtBudgetInterval: what an evaluation there will read
      (the curve's band widened by one evaluation's noise, `observation_se`).
    - computeToTarget: the compute at which the curve reaches budget.targetPassRate (0 where it
      starts there; null where its A does not reach it, or without a target).
    - etaSeconds: wall seconds from now to the budget and to the target, at `units`.
    - confidence: TooEarly with fewer than PREDICTION_MIN_POINTS points past the compute
      floor (the extrapolation rests on too little); else Misfit when the run's `backtest` (its
      first half's fit) did not hold its last evaluation (the run is not following the law, and
      the intervals assume it does); else OK.
    - backtest: that check, as `Backtest.to_dict` (null until there is one).
    """
    end, limit = budget.end(step, compute)
    reads = result.predict_interval(end, observation_se)
    to_target = _compute_to(result, budget.target_pass_rate)

    def eta(at: float | None) -> float | None:
        return None if at is None else max(0.0, at - compute) / units * 3600.0

    return {
        "predictedAtBudget": result.predict(end),
        "predictedAtBudgetInterval": None if reads is None else [reads[0], reads[1]],
        "budget": end,
        "budgetLimit": limit,
        "computeToTarget": to_target,
        "etaSeconds": {"budget": eta(end), "target": eta(to_target)},
        "confidence": _confidence(result, backtest),
        "backtest": None if backtest is None else backtest.to_dict(),
    }


def _confidence(result: FitResult, backtest: Backtest | None) -> str:
    if result.points < PREDICTION_MIN_POINTS:
        return TOO_EARLY
    if backtest is not None and backtest.inside is False:
        return MISFIT
    return OK


def _compute_to(result: FitResult, target: float | None) -> float | None:
    if target is None or result.A <= target:
        return None
    if target <= result.R0:
        return 0.0
    return float(compute_to_reach(target, result.A, result.B, result.C_mid, result.R0))
