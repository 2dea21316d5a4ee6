"""Where a fitted run is heading, in numbers a user can act on: the pass rate it will end at, the
compute at which it reaches its target, how long each is away, and what is known of the fit:
whether there are enough points to say any of it, and whether the run's half-run check
(`scalerl.fit.backtest`) ran and found it following the law."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from scalerl.fit import decision
from scalerl.fit.backtest import Backtest
from scalerl.fit.fitter import compute_floor
from scalerl.fit.result import FitResult
from scalerl.spec import MISFIT, OK, PREDICTION_MIN_POINTS, TOO_EARLY, UNCHECKED, BudgetSpec

__all__ = [
    "MISFIT",
    "OK",
    "TOO_EARLY",
    "UNCHECKED",
    "FitReport",
    "outlook",
    "seconds_per_compute",
]


@dataclass(frozen=True)
class FitReport:
    """A fit of a run's evaluations and the run's outlook from it (`scalerl.fit.outlook`)."""

    result: FitResult
    outlook: dict[str, Any]
    evaluations: int
    last_step: int | None
    # The evaluations the fit left out, each {step, compute, reason} (too many unscored samples).
    left_out: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """fit.json's fields (without the run's track)."""
        return {
            **self.result.to_dict(),
            **self.outlook,
            "evaluations": self.evaluations,
            "lastStep": self.last_step,
            "leftOut": [dict(row) for row in self.left_out],
        }


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
    """The run's outlook from `result`, for a run at `step` having spent `compute`: the one
    object every decision reads (`scalerl.fit.decision`, which holds the rules).

    - predictedAtBudget: the forecast (`FitResult.forecast`: the law, moved by as much of the
      run's drift as its own history supports) where the run will end (the first budget it
      hits, `budget`, named by `budgetLimit`); predictedAtBudgetInterval: what an evaluation
      there will read (`FitResult.predictive_interval`); budgetSet: the budget as set
      (`budget_set`); forecast: which model it is and why
      (`FitResult.forecast_model`); reach: the budget over the last fitted compute;
      forecastNotes: what the numbers cannot carry (`decision.forecast_notes`).
    - computeToTarget: where the forecast reaches budget.targetPassRate and stays there up to
      the budget (`decision.compute_to_target`).
    - etaSeconds: seconds from the last evaluation to the budget and to the target (null where
      there is none or it lies beyond the budget): wall seconds at `wall_per_compute` (the run's
      measured wall seconds per unit of compute, `seconds_per_compute`); without a measure,
      training seconds at `units` compute per hour (the run's GPUs, or processes); null
      without either.
    - confidence, and confidenceReason saying why it is not OK (`decision.confidence`): the
      forecast's half-run check; lawCheck: the law's own (`decision.law_check`).
    - backtest: that check, as `Backtest.to_dict` (null until there is one).
    """
    end, limit = budget.end(step, compute)
    predicted = float(result.forecast(end))
    reads = result.predictive_interval(end)
    interval = None if reads is None else (float(reads[0]), float(reads[1]))
    to_target = decision.compute_to_target(result, budget.target_pass_rate, end)
    per_compute = wall_per_compute
    if per_compute is None and units:
        per_compute = 3600.0 / units
    word, reason = decision.confidence(result, backtest, unchecked)
    return {
        "predictedAtBudget": predicted,
        "predictedAtBudgetInterval": None if interval is None else list(interval),
        "budget": end,
        "budgetLimit": limit,
        "budgetSet": budget_set(budget),
        "reach": result.reach(end),
        "forecast": result.forecast_model(),
        "forecastNotes": decision.forecast_notes(result, end, predicted, interval),
        "computeToTarget": to_target,
        "etaSeconds": {
            "budget": decision.eta(end, end, compute, per_compute),
            "target": decision.eta(to_target, end, compute, per_compute),
        },
        "confidence": word,
        "confidenceReason": reason,
        "lawCheck": decision.law_check(result, backtest),
        "backtest": None if backtest is None else backtest.to_dict(),
    }


def budget_set(budget: BudgetSpec) -> dict[str, float]:
    """The budget a prediction is made for, as set (`budgetSet`): a kept prediction is scored
    only against a run that ended under the same one (`scalerl.fit.track`)."""
    return {"maxSteps": budget.max_steps, "maxComputeHours": budget.max_compute_hours}


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
