"""The one object behind every decision (`scalerl.fit.decision`): the stop rule, the target, the
target line and the confidence words read the same forecast (audit F1, F2, F4).

The curves are the audit's (appendix S2, S3, S5): 24 evaluations at geomspace(1e-3, 1) with the
first at compute 0, SE 0.01 each."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.fit import sigmoid
from scalerl.fit.decision import (
    compute_to_target,
    confidence_words,
    stop_reason,
    target_words,
)
from scalerl.fit.drift import Drift
from scalerl.fit.report import fit_report
from scalerl.fit.result import FitResult
from scalerl.spec import MAX_STEPS, BudgetSpec, StopWhenSpec


def curve() -> np.ndarray:
    """The audit's compute: 24 evaluations, the first at compute 0."""
    c = np.geomspace(1e-3, 1.0, 24)
    c[0] = 0.0
    return c


def rows(c: np.ndarray, y: np.ndarray) -> list[dict[str, Any]]:
    return [
        {"step": i, "compute": float(x), "pass_rate": float(v), "pass_rate_se": 0.01}
        for i, (x, v) in enumerate(zip(c, y, strict=True))
    ]


def late_rise() -> tuple[np.ndarray, np.ndarray]:
    """S2: the law, then a slow rise in ln compute past c = 0.1 (as JustRL's curve)."""
    c = curve()
    y = np.asarray(sigmoid(c, 0.6, 2.0, 0.03, 0.1), dtype=float)
    y = y + np.where(c > 0.1, 0.05 * np.log(np.maximum(c, 1e-12) / 0.1), 0.0)
    return c, y


def rise_and_fall() -> tuple[np.ndarray, np.ndarray]:
    """S5: the law, then a fall in ln compute past c = 0.1."""
    c = curve()
    y = np.asarray(sigmoid(c, 0.9, 1.2, 0.3, 0.1), dtype=float)
    y = y - np.where(c > 0.1, 0.08 * np.log(np.maximum(c, 1e-12) / 0.1), 0.0)
    return c, y


def report(c: np.ndarray, y: np.ndarray, budget: float, target: float | None) -> dict[str, Any]:
    spec = BudgetSpec.model_construct(
        max_steps=MAX_STEPS, max_compute_hours=budget, target_pass_rate=target, stop_when=None
    )
    fitted = fit_report(rows(c, y), min_compute=None, budget=spec, units=1, seed=0)
    return fitted.to_dict()


def test_f1_stop_when_never_stops_a_run_its_forecast_says_reaches_the_threshold() -> None:
    # Before: the rule read A's interval [0.702, 0.763] and stopped the run whose status said
    # "target 0.8 reached at compute 7.66" of a budget of 30.
    c, y = late_rise()
    fit = report(c, y, budget=30.0, target=0.8)
    rule = BudgetSpec.model_construct(
        max_steps=MAX_STEPS,
        max_compute_hours=30.0,
        target_pass_rate=0.8,
        stop_when=StopWhenSpec(predicted_a_below=0.8),
    )
    reached = fit["computeToTarget"] is not None and fit["computeToTarget"] <= fit["budget"]
    stops = stop_reason(rule, {**fit, "confidence": "OK"})
    assert not (reached and stops), (fit["computeToTarget"], stops)
    lo, hi = fit["predictedAtBudgetInterval"]
    # The rule is the forecast's: it stops exactly when that interval lies below.
    assert (stops is not None) == (hi < 0.8 and hi - lo < 0.98)


def test_f1_the_stop_reads_the_forecast_interval_at_the_budget() -> None:
    budget = BudgetSpec.model_validate({"stopWhen": {"predictedABelow": 0.5, "minPoints": 8}})
    fit = {
        "A": 0.35, "A_interval": [0.30, 0.40], "points": 20, "confidence": "OK",
        "predictedAtBudget": 0.55, "predictedAtBudgetInterval": [0.45, 0.62],
    }  # fmt: skip
    # A's whole interval is below 0.5, but the forecast at the budget is not: no stop.
    assert stop_reason(budget, fit) is None
    below = {**fit, "predictedAtBudget": 0.40, "predictedAtBudgetInterval": [0.33, 0.46]}
    assert stop_reason(budget, below) == (
        "the forecast at the budget, 0.400 [0.330, 0.460] from 20 points (confidence OK), lies "
        "below stopWhen.predictedABelow 0.5"
    )
    assert stop_reason(budget, {**below, "points": 7}) is None
    assert stop_reason(BudgetSpec(), below) is None
    # An interval that spans [0, 1] says nothing and stops nothing, whatever the threshold.
    nothing = {**below, "predictedAtBudgetInterval": [0.0, 1.0]}
    assert (
        stop_reason(BudgetSpec.model_validate({"stopWhen": {"predictedABelow": 1.0}}), nothing)
        is None
    )


@pytest.mark.parametrize("confidence", ["TooEarly", "Unchecked", "Misfit", None])
def test_only_a_forecast_that_passed_its_half_run_check_stops_a_run(
    confidence: str | None,
) -> None:
    budget = BudgetSpec.model_validate({"stopWhen": {"predictedABelow": 0.5}})
    hopeless = {
        "points": 20, "confidence": confidence, "predictedAtBudget": 0.35,
        "predictedAtBudgetInterval": [0.30, 0.40],
    }  # fmt: skip
    assert stop_reason(budget, hopeless) is None
    assert stop_reason(budget, {**hopeless, "confidence": "OK"}) is not None


def test_f4_the_target_line_agrees_with_the_numbers_beside_it() -> None:
    # Before: "A is below target 0.64" beside A = 0.666, and "target 0.62 reached at compute
    # 4.438" beside a forecast of 0.612 at the budget.
    c, y = rise_and_fall()
    for target in (0.60, 0.62, 0.64, 0.70):
        fit = report(c, y, budget=30.0, target=target)
        line = target_words(fit, "GPU-hours", target)
        at = fit["computeToTarget"]
        if at is not None and at <= fit["budget"]:
            assert fit["predictedAtBudget"] >= target - 1e-9, (target, line, fit)
        if fit["predictedAtBudget"] >= target:
            assert "reached at" in line, (target, line)
        assert "A is below" not in line
        if "as is A's whole interval" in line:
            assert fit["A_interval"][1] < target


def hand_fit(rate: float, A: float = 0.7) -> FitResult:
    """A fit of the law (A, 1.5, 0.05, 0.2) fitted to compute 1, with a drift taken whole."""
    rng = np.random.default_rng(0)
    draws = np.column_stack(
        [
            np.clip(A + rng.normal(0, 0.01, 200), 0, 1),
            1.5 + rng.normal(0, 0.05, 200),
            0.05 * np.exp(rng.normal(0, 0.05, 200)),
            np.full(200, 0.2),
        ]
    )
    drift = Drift(rate=rate, spread=0.01, rate_se=0.002, origins=4)
    return FitResult(
        A=A, B=1.5, C_mid=0.05, R0=0.2, A_interval=(A - 0.02, A + 0.02), B_interval=None,
        C_mid_interval=None, points=20, excluded=0, sse=0.0, min_compute=0.0, r0_mode="fixed",
        fit_range=(0.01, 1.0), draws=draws, drift_probe=lambda: drift,
    )  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    rate=st.floats(-0.08, 0.08),
    target=st.floats(0.25, 0.95),
    end=st.floats(1.5, 200.0),
)
def test_compute_to_target_is_where_the_forecast_reaches_the_target_and_stays(
    rate: float, target: float, end: float
) -> None:
    fit = hand_fit(rate)
    at = compute_to_target(fit, target, end)
    at_end = float(fit.forecast(end))
    if at_end >= target:
        assert at is not None and at <= end
        assert float(fit.forecast(at)) == pytest.approx(target, abs=1e-6)
        # Never below the target again before the budget.
        later = np.geomspace(at * (1 + 1e-6), end, 200)
        assert np.all(np.asarray(fit.forecast(later)) >= target - 1e-6)
    else:
        assert at is None or at > end


def test_f2_the_law_s_check_is_reported_apart_from_the_forecast_s() -> None:
    # Before: one word, OK, for "law + drift held", while the law alone missed (S3).
    c, y = late_rise()
    fit = report(c, y, budget=30.0, target=None)
    assert fit["lawCheck"] == "Misses"
    assert fit["backtest"]["law"]["inside"] is False
    assert "law check Misses: the run does not follow the law alone" in confidence_words(fit)
    c = curve()
    law = report(c, np.asarray(sigmoid(c, 0.7, 1.5, 0.05, 0.1), dtype=float), 30.0, None)
    assert law["lawCheck"] == "Holds"
    assert law["confidence"] == "OK"
