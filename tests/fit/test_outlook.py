"""A fitted run's outlook: the compute and the time to its target and its budget, and when a
prediction is still too early, each checked against the law computed by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from scalerl.fit import fit_curve, sample_curve, sigmoid
from scalerl.fit.backtest import Backtest
from scalerl.fit.drift import Drift
from scalerl.fit.law import compute_to_reach
from scalerl.fit.outlook import outlook, seconds_per_compute
from scalerl.spec import PREDICTION_MIN_POINTS, BudgetSpec

LAW = {"A": 0.9, "B": 2.0, "C_mid": 0.8, "R0": 0.15}


def fitted(points: int = 20, last: float = 3.0):  # type: ignore[no-untyped-def]
    compute = np.linspace(0.0, last, points)
    rates = sample_curve(compute, *LAW.values(), noise=0.0005, seed=3)
    return fit_curve(compute, rates, min_compute=0.0)


def test_the_compute_and_time_to_a_target_are_where_the_curve_reaches_it() -> None:
    result = fitted()
    budget = BudgetSpec(max_compute_hours=6.0, target_pass_rate=0.6)
    said = outlook(result, budget, step=150, compute=3.0, units=4)
    # By hand: 0.6 = R0 + (A - R0) / (1 + (C_mid / C)^B)  =>  C = C_mid (A-R0 / 0.6-R0 - 1)^(-1/B)
    truth = 0.8 * ((0.9 - 0.15) / (0.6 - 0.15) - 1.0) ** (-1.0 / 2.0)
    assert said["computeToTarget"] == pytest.approx(truth, rel=0.02)
    assert sigmoid(said["computeToTarget"], result.A, result.B, result.C_mid, result.R0) == (
        pytest.approx(0.6, abs=1e-9)
    )
    # Already past it at compute 3.0: no time left. The budget, 3 compute-hours away at 4
    # units (GPUs) per wall hour: 45 minutes.
    assert said["etaSeconds"] == {"budget": pytest.approx(3.0 / 4 * 3600), "target": 0.0}
    # No half-run check was handed in: enough points, but nothing checked them.
    assert said["confidence"] == "Unchecked"


def test_a_target_ahead_is_reached_at_the_run_s_rate() -> None:
    result = fitted(last=0.6)
    said = outlook(
        result,
        BudgetSpec(max_compute_hours=6.0, target_pass_rate=0.8),
        step=60,
        compute=0.6,
        units=2,
    )
    at = said["computeToTarget"]
    assert at > 0.6
    assert said["etaSeconds"]["target"] == pytest.approx((at - 0.6) / 2 * 3600)


@pytest.mark.parametrize(("target", "expected"), [(0.95, None), (0.1, 0.0), (None, None)])
def test_a_target_the_curve_never_reaches_has_no_compute(
    target: float | None, expected: float | None
) -> None:
    said = outlook(fitted(), BudgetSpec(target_pass_rate=target), step=150, compute=3.0, units=1)
    assert said["computeToTarget"] == expected
    assert said["etaSeconds"]["target"] == (None if expected is None else 0.0)


def test_too_few_points_past_the_floor_is_too_early() -> None:
    compute = np.linspace(0.0, 3.0, 20)
    rates = sample_curve(compute, *LAW.values(), noise=0.0005, seed=3)
    # A floor that leaves fewer points than a prediction needs.
    floor = compute[-(PREDICTION_MIN_POINTS - 1)]
    early = fit_curve(compute, rates, min_compute=float(floor))
    assert early.points == PREDICTION_MIN_POINTS - 1
    said = outlook(early, BudgetSpec(), step=150, compute=3.0, units=1)
    assert said["confidence"] == "TooEarly"
    assert math.isfinite(said["predictedAtBudget"])


def check(inside: bool | None) -> Backtest:
    interval = None if inside is None else ((0.5, 0.6) if inside else (0.7, 0.8))
    return Backtest(fitted_on=10, compute=3.0, predicted=0.55, interval=interval, actual=0.55)


@pytest.mark.parametrize(
    ("test", "unchecked", "word", "reason"),
    [
        (None, "the half-run check needs 8 ...; it has 5", "Unchecked",
         "the half-run check needs 8 ...; it has 5"),
        (check(None), "", "Unchecked", "the half-run check has no interval (no bootstrap)"),
        (check(False), "", "Misfit",
         "the half-run check's forecast interval missed the last evaluation"),
        (check(True), "", "OK", None),
    ],
)  # fmt: skip
def test_ok_means_the_half_run_check_ran_and_held(
    test: Backtest | None, unchecked: str, word: str, reason: str | None
) -> None:
    said = outlook(fitted(), BudgetSpec(), step=150, compute=3.0, units=1, backtest=test,
                   unchecked=unchecked)  # fmt: skip
    assert (said["confidence"], said["confidenceReason"]) == (word, reason)


def test_too_early_says_how_many_points_it_has() -> None:
    compute = np.linspace(0.0, 3.0, 20)
    rates = sample_curve(compute, *LAW.values(), noise=0.0005, seed=3)
    early = fit_curve(compute[:6], rates[:6], min_compute=0.0)
    assert early.points == 5  # trained: compute > 0; the step-0 evaluation sets R0
    said = outlook(early, BudgetSpec(), step=50, compute=float(compute[5]), units=1,
                   backtest=check(True))  # fmt: skip
    assert said["confidence"] == "TooEarly"
    assert said["confidenceReason"].startswith("5 trained evaluations past the compute floor")


def test_a_target_beyond_the_budget_has_no_time() -> None:
    # The curve reaches 0.8 past compute 0.6, but the budget ends the run at 0.6: beyond it the
    # crossing is followed only as far as the evidence reaches (3x the data), or not at all.
    result = fitted(last=0.6)
    budget = BudgetSpec(max_compute_hours=0.6, target_pass_rate=0.8)
    said = outlook(result, budget, step=60, compute=0.6, units=2)
    assert said["computeToTarget"] is None or said["computeToTarget"] > 0.6
    assert said["predictedAtBudget"] < 0.8
    assert said["etaSeconds"] == {"budget": 0.0, "target": None}


def test_wall_pace_is_the_median_over_evaluations() -> None:
    # 10 s of wall per 0.001 compute, but one resume an hour later between the 3rd and 4th.
    compute = [0.0, 0.001, 0.002, 0.003, 0.004, 0.005]
    times = [0.0, 10.0, 20.0, 3630.0, 3640.0, 3650.0]
    assert seconds_per_compute(times, compute) == pytest.approx(10.0 / 0.001)
    assert seconds_per_compute([None] * 6, compute) is None
    said = outlook(fitted(), BudgetSpec(max_compute_hours=6.0), step=150, compute=3.0, units=4,
                   wall_per_compute=1000.0)  # fmt: skip
    assert said["etaSeconds"]["budget"] == pytest.approx(3.0 * 1000.0)


def test_a_target_beyond_the_data_is_where_the_forecast_reaches_it() -> None:
    # The demo's straight early curve (tests/fit/test_intervals.py): the law bends below where
    # the run goes; with a drift taken whole (as a history that kept missing upwards gives it)
    # the forecast, predictedAtBudget's, is lifted, and computeToTarget follows it.
    compute = np.linspace(0.0, 0.0064, 21)[:11]
    rates = 0.18 + (0.91 - 0.18) * compute / 0.0064
    measured = fit_curve(compute, rates, sigma=np.full(rates.size, 0.012))
    rate, last = 0.5, float(compute[-1])  # logit gained per unit of ln compute
    result = dataclasses.replace(measured, drift_probe=lambda: Drift(rate, 0.01, 0.001, 4))
    target = 0.8
    budget = BudgetSpec(target_pass_rate=target, max_compute_hours=100 * last)
    said = outlook(result, budget, step=50, compute=last, units=1)
    at = said["computeToTarget"]

    def by_hand(c: float) -> float:  # the law's logit plus the drift's line in ln compute
        law = float(sigmoid(c, result.A, result.B, result.C_mid, result.R0))
        moved = math.log(law / (1.0 - law)) + rate * math.log(c / last)
        return 1.0 / (1.0 + math.exp(-moved))

    assert at > last
    assert by_hand(at) == pytest.approx(target, abs=1e-6)
    assert by_hand(at * 0.99) < target  # the first compute that reads it
    # Not where the law alone reaches it.
    law_at = float(compute_to_reach(target, result.A, result.B, result.C_mid, result.R0))
    assert not math.isclose(at, law_at, rel_tol=0.01)
    # A run falling behind its law (a negative drift) that the forecast never lifts to the
    # target within a thousand times the data: none, although the law alone would get there.
    lagging = dataclasses.replace(result, drift_probe=lambda: Drift(-3.0, 0.0, 0.0, 3))
    assert result.A > target
    said = outlook(lagging, BudgetSpec(target_pass_rate=target), step=50, compute=last, units=1)
    assert said["computeToTarget"] is None
