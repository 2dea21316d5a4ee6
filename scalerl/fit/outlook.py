"""Where a fitted run is heading, in numbers a user can act on: the pass rate it will end at, the
compute at which it reaches its target, how long each is away, and what is known of the fit:
whether there are enough points to say any of it, and whether the run's half-run check
(`scalerl.fit.backtest`) ran and found it following the law."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from scalerl.fit.backtest import Backtest
from scalerl.fit.fitter import compute_floor
from scalerl.fit.law import compute_to_reach
from scalerl.fit.result import FitResult
from scalerl.spec import MISFIT, OK, PREDICTION_MIN_POINTS, TOO_EARLY, UNCHECKED, BudgetSpec

__all__ = ["MISFIT", "OK", "TOO_EARLY", "UNCHECKED", "outlook", "seconds_per_compute"]

# How far past its data a run's forecast is followed to find where it reaches the target: the
# drift is a line in ln compute measured over the data's own span, and carried a thousand times
# further it says nothing a user should plan on.
TARGET_HORIZON = 1000.0


def outlook(
    result: FitResult,
    budget: BudgetSpec,
    *,
    step: int,
    compute: float,
    units: int | None,
    backtest: Backtest | None = None,
    unchecked: str = "",
    wall_per_compute: float | None = None,
) -> dict[str, Any]:
    """The run's outlook from `result`, for a run at `step` having spent `compute`.

    - predictedAtBudget: the forecast (the law, moved by the run's measured drift from it:
      `FitResult.forecast`) where the run will end (the first budget it hits, `budget`,
      named by `budgetLimit`); predictedAtBudgetInterval: what an evaluation there will read
      (`FitResult.predictive_interval`).
    - computeToTarget: the compute at which the run reaches budget.targetPassRate: where the law
      does within the data, beyond it where the forecast does (as predictedAtBudget, up to
      TARGET_HORIZON times the last fitted compute); 0 where the curve starts there; null
      where neither reaches it, or without a target.
    - etaSeconds: seconds from the last evaluation to the budget and to the target (null where
      there is none or it lies beyond the budget): wall seconds at `wall_per_compute` (the run's
      measured wall seconds per unit of compute, `seconds_per_compute`); without a measure,
      training seconds at `units` compute per hour (the run's GPUs, or processes); null
      without either.
    - confidence, and confidenceReason saying why it is not OK: TooEarly with fewer than
      PREDICTION_MIN_POINTS trained points past the floor; Unchecked when the half-run
      `backtest` could not run (`unchecked` says why); Misfit when it ran and its interval
      missed the last evaluation (the run is not following the law, and the intervals assume
      it does); OK only when it ran and held.
    - backtest: that check, as `Backtest.to_dict` (null until there is one).
    """
    end, limit = budget.end(step, compute)
    reads = result.predictive_interval(end)
    to_target = _compute_to(result, budget.target_pass_rate)
    per_compute = wall_per_compute
    if per_compute is None and units:
        per_compute = 3600.0 / units

    def eta(at: float | None) -> float | None:
        if at is None or at > end or per_compute is None:
            return None
        return max(0.0, at - compute) * per_compute

    confidence, reason = _confidence(result, backtest, unchecked)
    return {
        "predictedAtBudget": result.forecast(end),
        "predictedAtBudgetInterval": None if reads is None else [reads[0], reads[1]],
        "budget": end,
        "budgetLimit": limit,
        "computeToTarget": to_target,
        "etaSeconds": {"budget": eta(end), "target": eta(to_target)},
        "confidence": confidence,
        "confidenceReason": reason,
        "backtest": None if backtest is None else backtest.to_dict(),
    }


def _confidence(
    result: FitResult, backtest: Backtest | None, unchecked: str
) -> tuple[str, str | None]:
    if result.points < PREDICTION_MIN_POINTS:
        return TOO_EARLY, (
            f"{result.points} trained evaluations past the compute floor "
            f"{result.min_compute:.4g}; a prediction needs {PREDICTION_MIN_POINTS}"
        )
    if backtest is None or backtest.inside is None:
        why = unchecked or "the half-run check has no interval (no bootstrap)"
        return UNCHECKED, why
    if backtest.inside is False:
        return MISFIT, "the half-run check's interval missed the last evaluation"
    return OK, None


def unchecked_reason(compute: ArrayLike, min_compute: float | None) -> str:
    """Why the half-run check (`scalerl.fit.backtest`) found nothing to check on `compute`
    (sorted): too few trained points past the floor in the first half of the compute, counted
    as its fit counts them, or else that half could not be fitted."""
    c = np.asarray(compute, dtype=float)
    half = c[c <= c[-1] / 2] if c.size else c
    floor = compute_floor(float(half[-1]), min_compute) if half.size else 0.0
    have = int(((half > 0) & (half >= floor)).sum())
    if have < PREDICTION_MIN_POINTS:
        return (
            f"the half-run check needs {PREDICTION_MIN_POINTS} evaluations past the floor in "
            f"the first half of the compute; it has {have}"
        )
    return "the half-run check could not fit the first half of the compute"


def seconds_per_compute(times: Sequence[float | None], compute: Sequence[float]) -> float | None:
    """The run's wall seconds per unit of compute: the median over consecutive evaluations of
    (wall time between them) / (compute between them). Compute counts training only, while the
    wall clock also runs through evaluations, start-ups and restarts; the median keeps one long
    pause (a resume the next day) from counting as the run's pace. None without two evaluations
    that carry a time and compute apart."""
    pairs = [(float(t), float(c)) for t, c in zip(times, compute, strict=True) if t is not None]
    ratios = [
        (t1 - t0) / (c1 - c0)
        for (t0, c0), (t1, c1) in zip(pairs, pairs[1:], strict=False)
        if c1 > c0 and t1 >= t0
    ]
    return statistics.median(ratios) if ratios else None


def _compute_to(result: FitResult, target: float | None) -> float | None:
    if target is None:
        return None
    if target <= result.R0:
        return 0.0
    last = result.fit_range[1]
    law = float(compute_to_reach(target, result.A, result.B, result.C_mid, result.R0))
    if result.drift is None or law <= last:  # within the data the forecast is the law
        return law if np.isfinite(law) else None
    # Beyond the data: the first compute at which the forecast reads the target.
    grid = last * np.geomspace(1.0, TARGET_HORIZON, 400)
    above = np.flatnonzero(np.asarray(result.forecast(grid)) >= target)
    if above.size == 0 or above[0] == 0:  # never, or (rounding) already at the data's end
        return None if above.size == 0 else float(last)

    def short(log_c: float) -> float:
        return float(result.forecast(np.exp(log_c))) - target

    lo, hi = np.log(grid[above[0] - 1]), np.log(grid[above[0]])
    return float(np.exp(brentq(short, lo, hi, xtol=1e-12)))
