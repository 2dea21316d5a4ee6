"""A fitted run's outlook: the compute and the time to its target and its budget, and when a
prediction is still too early, each checked against the law computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalerl.fit import fit_curve, sample_curve, sigmoid
from scalerl.fit.outlook import outlook
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
    assert said["confidence"] == "OK"


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
