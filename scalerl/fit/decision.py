"""One object behind every decision a prediction drives, by one rule.

A fit's outlook (`scalerl.fit.outlook`) holds one forecast of where the run will read: the
forecast at the run's budget (`predictedAtBudget`, `FitResult.forecast`: the law, moved by as
much of the run's drift as its own history supports, `scalerl.fit.drift`), what an evaluation
there will read (`predictedAtBudgetInterval`), and one `confidence` (whether that forecast, made
from the first half of the run, held at its last evaluation: `scalerl.fit.backtest`). Every
decision reads those and nothing else:

- `computeToTarget`: where the forecast reaches budget.targetPassRate and stays at or above it
  up to the budget (`compute_to_target`); null where it is below the target at the budget. A
  forecast that passes the target and falls back below it before the budget does not reach it
  (audit F4). Beyond the budget it is followed as far as the calibration evidence reaches
  (`EVIDENCE_REACH` times the data), no further.
- `etaSeconds`: the seconds to the budget and to that compute (`eta`).
- `budget.stopWhen` (`stop_reason`, a cluster's and `scalerl run`'s): stop only on a fit whose
  confidence is OK and of at least stopWhen.minPoints points, when the whole interval of the
  forecast at the budget lies below stopWhen.predictedABelow: the run cannot reach that pass rate
  within what it may spend. Never on an interval that says nothing (as wide as [0, 1]). So a
  run whose status says it reaches the target is never stopped for missing it (audit F1).
- the target line (`target_words`): where the forecast reaches the target, or what it reads at
  the budget when it does not; never "A is below the target" unless A's interval is.
- a sweep's early stop and leaderboard (`scalerl.fit.earlystop`, `scalerl.fit.leaderboard`):
  a trusted fit's ceiling and floor are that same interval's ends (`fit_bounds`).

What the numbers cannot carry is said beside them (`forecast_notes`, `notes_words`): a forecast
that reads above the upper end of A's interval (the drift carries it past the law's ceiling), a
reach past the calibration evidence (more than EVIDENCE_REACH times the last fitted compute), and
an interval as wide as [0, 1], which says nothing.

The confidence words (`scalerl.spec.evaluation`) mean one thing each: `confidence` is the
forecast's half-run check; `lawCheck` is the law's own (`Holds` / `Misses`): whether the run
follows the law, whatever the forecast made of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scalerl.spec import (
    LAW_HOLDS,
    LAW_MISSES,
    MISFIT,
    OK,
    PREDICTION_MIN_POINTS,
    TOO_EARLY,
    UNCHECKED,
    BudgetSpec,
)

if TYPE_CHECKING:
    from scalerl.fit.backtest import Backtest
    from scalerl.fit.result import FitResult

# The calibration evidence covers predictions up to this many times the last fitted compute
# (half-run checks and the Table 1 protocol reach 2x): further out a prediction is marked.
EVIDENCE_REACH = 3.0
# An interval at least this wide says nothing about where the run will read.
NOTHING_WIDTH = 0.98
# The forecast's notes (`forecastNotes`), one word each.
ABOVE_A, BEYOND_EVIDENCE, SAYS_NOTHING = "AboveA", "BeyondEvidence", "SaysNothing"
# Points per doubling of compute where the target crossing is searched.
_TARGET_GRID = 64


def confidence(
    result: FitResult, backtest: Backtest | None, unchecked: str
) -> tuple[str, str | None]:
    """The forecast's confidence word and why it is not OK: TooEarly with fewer than
    PREDICTION_MIN_POINTS trained points past the floor; Unchecked when the half-run check could
    not run (`unchecked` says why); Misfit when it ran and the first half's forecast interval
    missed the last evaluation; OK only when it ran and held."""
    if result.points < PREDICTION_MIN_POINTS:
        return TOO_EARLY, (
            f"{result.points} trained evaluations past the compute floor "
            f"{result.min_compute:.4g}; a prediction needs {PREDICTION_MIN_POINTS}"
        )
    if backtest is None or backtest.inside is None:
        why = unchecked or "the half-run check has no interval (no bootstrap)"
        return UNCHECKED, why
    if backtest.inside is False:
        return MISFIT, "the half-run check's forecast interval missed the last evaluation"
    return OK, None


def law_check(result: FitResult, backtest: Backtest | None) -> str | None:
    """Holds / Misses: whether the first half's law alone held the last evaluation within its
    own interval; null where the check did not run (or the fit is TooEarly)."""
    if result.points < PREDICTION_MIN_POINTS or backtest is None:
        return None
    inside = backtest.law_inside
    if inside is None:
        return None
    return LAW_HOLDS if inside else LAW_MISSES


def compute_to_target(result: FitResult, target: float | None, end: float) -> float | None:
    """Where the forecast reaches `target` and stays at or above it up to the budget `end`
    (the module's rule); 0 where the curve starts there. Where the forecast is below the target
    at the budget: the first compute past the budget where it reaches it, up to
    max(end, EVIDENCE_REACH x the data); None where it does not, or without a target."""
    import numpy as np
    from scipy.optimize import brentq

    from scalerl.fit.law import compute_to_reach

    if target is None:
        return None
    if target <= result.R0:
        return 0.0
    last = result.fit_range[1]
    first = result.fit_range[0] if result.fit_range[0] > 0 else last * 1e-3
    horizon = max(end, EVIDENCE_REACH * last)
    count = int(max(math.log2(horizon / first), 1.0) * _TARGET_GRID)
    grid = np.unique(np.append(np.geomspace(first, horizon, count), end))
    below = np.asarray(result.forecast(grid), dtype=float) < target
    at_end = int(np.searchsorted(grid, end))
    if not below[at_end]:
        earlier = np.flatnonzero(below[:at_end])
        if earlier.size == 0:  # above from the first fitted point: the law's crossing
            law = float(compute_to_reach(target, result.A, result.B, result.C_mid, result.R0))
            return law if math.isfinite(law) else float(grid[0])
        lo_index = int(earlier[-1])
    else:
        later = np.flatnonzero(~below[at_end:])
        if later.size == 0:
            return None
        lo_index = at_end + int(later[0]) - 1

    def short(log_c: float) -> float:
        return float(result.forecast(math.exp(log_c))) - target

    lo, hi = math.log(grid[lo_index]), math.log(grid[lo_index + 1])
    return float(math.exp(brentq(short, lo, hi, xtol=1e-12)))


def eta(at: float | None, end: float, compute: float, per_compute: float | None) -> float | None:
    """Seconds from `compute` to `at` at `per_compute` seconds per unit; None where there is no
    `at`, it lies beyond the budget `end`, or no pace is known."""
    if at is None or at > end or per_compute is None:
        return None
    return max(0.0, at - compute) * per_compute


def forecast_notes(
    result: FitResult, end: float, predicted: float, interval: tuple[float, float] | None
) -> list[str]:
    """The notes the forecast at the budget `end` needs beside it (the module's list)."""
    notes = []
    a_interval = result.A_interval
    if a_interval is not None and result.A_at_least is None and predicted > a_interval[1]:
        notes.append(ABOVE_A)
    if result.reach(end) > EVIDENCE_REACH:
        notes.append(BEYOND_EVIDENCE)
    if interval is not None and interval[1] - interval[0] >= NOTHING_WIDTH:
        notes.append(SAYS_NOTHING)
    return notes


def notes_words(fit: Mapping[str, Any]) -> str:
    """'; <note>; <note>' in words for fit.json's `forecastNotes` ('' without any)."""
    words = []
    notes = fit.get("forecastNotes") or []
    if SAYS_NOTHING in notes:
        words.append("the interval spans [0, 1]: it says nothing about where the run ends")
    if ABOVE_A in notes:
        a = fit.get("A_interval") or [math.nan, math.nan]
        words.append(
            f"the forecast reads above A's interval [{a[0]:.3f}, {a[1]:.3f}]: the run's drift "
            "carries it past the law's ceiling"
        )
    if BEYOND_EVIDENCE in notes:
        reach = fit.get("reach")
        times = f"{reach:.3g}x" if isinstance(reach, int | float) else "far past"
        words.append(
            f"the budget lies {times} the fitted compute, beyond the {EVIDENCE_REACH:g}x the "
            "calibration evidence covers"
        )
    return "".join(f"; {w}" for w in words)


def stop_reason(budget: BudgetSpec, prediction: Mapping[str, Any] | None) -> str | None:
    """Why the run should stop now (spec.budget.stopWhen), or None; the one rule for a cluster
    and for `scalerl run` (the module's rule): a fit whose forecast passed its half-run check
    (confidence OK) of at least stopWhen.minPoints trained evaluations, whose whole interval at
    the budget lies below stopWhen.predictedABelow. A TooEarly fit rests on too little, an
    Unchecked one was never tested, a Misfit one's intervals did not hold, a point estimate below
    the threshold is not enough to throw away the compute already spent, and an interval that
    spans [0, 1] says nothing."""
    rule = budget.stop_when
    if rule is None or not prediction or prediction.get("confidence") != OK:
        return None
    interval = prediction.get("predictedAtBudgetInterval")
    if interval is None or prediction.get("points", 0) < rule.min_points:
        return None
    if interval[1] - interval[0] >= NOTHING_WIDTH or interval[1] >= rule.predicted_a_below:
        return None
    return (
        f"the forecast at the budget, {prediction['predictedAtBudget']:.3f} "
        f"[{interval[0]:.3f}, {interval[1]:.3f}] from {prediction['points']} points "
        f"(confidence OK), lies below stopWhen.predictedABelow {rule.predicted_a_below}"
    )


def target_words(fit: Mapping[str, Any], unit: str, target: float | None) -> str:
    """', <where the forecast reaches the target>' ('' without a target): reached within the
    budget at computeToTarget, beyond it, or not at all, with what the forecast reads at the
    budget; that A's interval lies below the target only where it does."""
    if target is None:
        return ""
    at = fit.get("computeToTarget")
    name = f"target {target:g}"
    unit = f" {unit}" if unit else ""
    if at is not None and at <= fit["budget"]:
        return f", {name} reached at compute {at:.4g}{unit}"
    if at is not None:
        return (
            f", {name} lies beyond the budget (the forecast reaches it at compute {at:.4g}{unit})"
        )
    words = f", the forecast at the budget ({fit['predictedAtBudget']:.3f}) is below {name}"
    a_interval = fit.get("A_interval")
    if a_interval and fit.get("A_atLeast") is None and a_interval[1] < target:
        words += f", as is A's whole interval [{a_interval[0]:.3f}, {a_interval[1]:.3f}]"
    return words


def confidence_note(fit: Mapping[str, Any]) -> str:
    """'; <confidence>: <why>' for a TooEarly or Unchecked fit ('' for any other), to add to its
    summary (a Misfit's says more: `misfit_note`)."""
    word, why = fit.get("confidence"), fit.get("confidenceReason")
    if word in (None, OK, MISFIT) or not why:
        return ""
    return f"; {word}: {why}"


def misfit_note(fit: Mapping[str, Any]) -> str:
    """What a Misfit confidence means for this fit ('' for any other), to add to its summary."""
    test = fit.get("backtest")
    if fit.get("confidence") != MISFIT or not test or not test.get("interval"):
        return ""
    lo, hi = test["interval"]
    return (
        f"; Misfit: fitted on the first half of the compute, the forecast was "
        f"{test['predicted']:.3f} [{lo:.3f}, {hi:.3f}] for the last evaluation, which read "
        f"{test['actual']:.3f}: its intervals did not hold on this run"
    )


def law_words(fit: Mapping[str, Any]) -> str:
    """'; law alone <Holds|Misses>' ('' where the law's check did not run)."""
    word = fit.get("lawCheck")
    if word is None:
        return ""
    what = "follows the law" if word == LAW_HOLDS else "does not follow the law alone"
    return f"; law check {word}: the run {what}"


def confidence_words(fit: Mapping[str, Any]) -> str:
    """'; <confidence>: <why>' (a Misfit's: `misfit_note`), then the law's check; '' for a fit
    without a confidence."""
    word = fit.get("confidence")
    if word is None:
        return ""
    if word == MISFIT:
        head = misfit_note(fit)
    else:
        head = f"; {word}: {fit.get('confidenceReason') or 'the half-run check held'}"
    return head + law_words(fit)


def fit_bounds(fit: Mapping[str, Any]) -> tuple[float, float] | None:
    """A trusted fit's floor and ceiling for what its run reaches within its budget: the ends of
    the forecast's interval at the budget (the sweep's early stop and leaderboard read these,
    as stopWhen does); None where that interval says nothing."""
    interval = fit.get("predictedAtBudgetInterval")
    if not interval or interval[1] - interval[0] >= NOTHING_WIDTH:
        return None
    return float(interval[0]), float(interval[1])
