"""The forecast's band beyond the data (audit F3): never narrower further out, never a point,
and what it cannot say in numbers said beside them (above A, beyond the evidence, [0, 1])."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from scalerl.fit.decision import (
    ABOVE_A,
    BEYOND_EVIDENCE,
    SAYS_NOTHING,
    forecast_notes,
    notes_words,
)
from scalerl.fit.drift import Drift
from scalerl.fit.fitter import fit_curve
from scalerl.fit.result import FitResult


def hand_fit(A: float, B: float, rate: float, spread: float, above: int, seed: int) -> FitResult:
    """A fit of the law (A, B, 0.05, 0.2) to compute 1 with 200 bootstrap draws about it and a
    drift judged on 20 later evaluations, `above` of them above their prefixes' intervals."""
    rng = np.random.default_rng(seed)
    draws = np.column_stack(
        [
            np.clip(A + rng.normal(0, 0.02, 200), 0.21, 1),
            np.maximum(B + rng.normal(0, 0.1, 200), 0.1),
            0.05 * np.exp(rng.normal(0, 0.1, 200)),
            np.full(200, 0.2),
        ]
    )
    up, down = (above, 0) if rate >= 0 else (0, above)
    drift = Drift(rate, spread, 0.002, 6, compared=20, above=up, below=down, judged=True)
    return FitResult(
        A=A, B=B, C_mid=0.05, R0=0.2, A_interval=(A - 0.04, min(A + 0.04, 1.0)),
        B_interval=None, C_mid_interval=None, points=20, excluded=0, sse=0.0, min_compute=0.0,
        r0_mode="fixed", fit_range=(0.01, 1.0), draws=draws, drift_probe=lambda: drift,
    )  # fmt: skip


@settings(max_examples=60, deadline=None)
@example(A=1.0, B=1.0, rate=0.0, spread=0.0, above=0, seed=0, near=0.0, further=1.0, noise=0.01)
@given(
    A=st.floats(0.3, 1.0),
    B=st.floats(0.5, 3.0),
    rate=st.floats(-0.1, 0.1),
    spread=st.floats(0.0, 0.1),
    above=st.integers(0, 20),
    seed=st.integers(0, 3),
    near=st.floats(0.0, 12.0),
    further=st.floats(0.0, 8.0),
    noise=st.sampled_from([0.0, 0.01]),
)
def test_the_band_never_narrows_with_distance_and_never_collapses(
    A: float,
    B: float,
    rate: float,
    spread: float,
    above: int,
    seed: int,
    near: float,
    further: float,
    noise: float,
) -> None:
    fit = hand_fit(A, B, rate, spread, above, seed)
    c1, c2 = np.exp(near), np.exp(near + further)  # beyond the data (which ends at 1)
    lo1, hi1 = fit.predict_interval(c1, noise)
    lo2, hi2 = fit.predict_interval(c2, noise)
    assert 0.0 <= lo1 < hi1 <= 1.0 and 0.0 <= lo2 < hi2 <= 1.0
    # The curve's band is moved inside [0, 1] whole; an evaluation's noise on it is cut there (an
    # evaluation reads within [0, 1]: test_intervals), so only an end it carries past 0 or 1
    # may make the band further out narrower. Noise only ever widens the band.
    (near_lo, near_hi), (curve_lo, curve_hi) = fit.predict_interval(c1), fit.predict_interval(c2)
    assert curve_hi - curve_lo >= near_hi - near_lo - 1e-12
    assert lo2 <= curve_lo + 1e-12 and curve_hi - 1e-12 <= hi2
    if 0.0 < lo2 and hi2 < 1.0:
        assert hi2 - lo2 >= hi1 - lo1 - 1e-12
    # The forecast lies within its band, and an array asks the same as a number.
    assert lo2 - 1e-12 <= float(fit.forecast(c2)) <= hi2 + 1e-12
    both = fit.predict_interval(np.array([c1, c2]), noise)
    assert np.allclose(both[0], [lo1, lo2]) and np.allclose(both[1], [hi1, hi2])


def straight() -> FitResult:
    """S4: a run that climbs straight in ln compute, noise-free, 24 evaluations."""
    c = np.geomspace(1e-3, 1.0, 24)
    c[0] = 0.0
    y = 0.1 + 0.075 * np.log(np.maximum(c, 1e-3) / 1e-3)
    return fit_curve(c, y, sigma=np.full(24, 0.01), seed=0)


def test_f3_far_out_the_band_neither_narrows_nor_collapses_and_says_what_it_is() -> None:
    # Before: 1.000 [0.855, 1.000] at 100x, [0.988, 1.000] at 1e4x, [1.000, 1.000] at 1e5x.
    fit = straight()
    widths = []
    for budget in (10.0, 100.0, 1e3, 1e4, 1e5, 1e6):
        lo, hi = fit.predictive_interval(budget)
        widths.append(hi - lo)
        predicted = float(fit.forecast(budget))
        notes = forecast_notes(fit, budget, predicted, (lo, hi))
        assert BEYOND_EVIDENCE in notes  # 10x the data and more
        assert fit.A_interval is not None
        assert (ABOVE_A in notes) == (fit.A_at_least is None and predicted > fit.A_interval[1])
    assert min(widths) > 0.0
    assert widths == sorted(widths)


def test_the_notes_name_what_the_numbers_cannot_carry() -> None:
    fit = {
        "A_interval": [0.70, 0.76], "reach": 100.0,
        "forecastNotes": [SAYS_NOTHING, ABOVE_A, BEYOND_EVIDENCE],
    }  # fmt: skip
    said = notes_words(fit)
    assert "the interval spans [0, 1]: it says nothing about where the run ends" in said
    assert "above A's interval [0.700, 0.760]" in said
    assert "the budget lies 100x the fitted compute, beyond the 3x" in said
    assert notes_words({"forecastNotes": []}) == ""


@pytest.mark.parametrize("budget", [1.5, 3.0])
def test_within_the_evidence_nothing_is_marked(budget: float) -> None:
    fit = hand_fit(0.7, 1.5, 0.0, 0.0, 0, 0)
    lo, hi = fit.predictive_interval(budget)
    assert forecast_notes(fit, budget, float(fit.forecast(budget)), (lo, hi)) == []


def test_a_band_as_wide_as_0_to_1_is_marked() -> None:
    fit = hand_fit(0.7, 1.5, 0.0, 0.0, 0, 0)
    assert SAYS_NOTHING in forecast_notes(fit, 2.0, 0.5, (0.0, 1.0))


def test_a_drift_up_near_the_ceiling_slows_and_never_reads_1() -> None:
    # The drift moves the law's logit (scalerl.fit.drift): near the ceiling each doubling of
    # compute gains less, as a bounded pass rate does. A drift straight in the pass rate read
    # 1.000 here from 4x the data on (0.92 + 0.3 ln 4 > 1), its band [x, 1.000].
    fit = hand_fit(0.9, 1.5, 0.3, 0.0, 20, 0)
    assert fit.drift is not None and fit.drift.weight == 1.0
    budgets = [2.0, 4.0, 8.0, 16.0, 32.0]
    forecasts = [float(fit.forecast(b)) for b in budgets]
    for budget, forecast in zip(budgets, forecasts, strict=True):
        law = float(fit.predict(budget))
        logit = np.log(law / (1 - law)) + 0.3 * np.log(budget)  # by hand, from the fitted range
        assert forecast == pytest.approx(1 / (1 + np.exp(-logit)), abs=1e-9)
        assert law < forecast < 1.0
    gains = np.diff(forecasts)
    assert np.all(gains > 0) and np.all(np.diff(gains) < 0)


@pytest.mark.parametrize("budget", [1.0, 2.0, 10.0, 1e4])
def test_at_weight_0_the_forecast_and_its_band_are_the_law_s_exactly(budget: float) -> None:
    # A drift measured, but no history behind it (no later evaluation outside its prefixes'
    # intervals): weight 0. The logit's round trip moves nothing: not a law at 0.99999999 far
    # out (it read 0.9999, the logit's edge then), not a band's end at 1.
    fit = hand_fit(1.0, 1.5, 0.3, 0.05, 0, 0)
    assert fit.drift is not None and fit.drift.weight == 0.0
    law = dataclasses.replace(fit, drift_probe=None)
    assert fit.forecast(budget) == law.predict(budget)
    assert fit.predict_interval(budget) == law.predict_interval(budget)
    assert fit.predictive_interval(budget) == law.predictive_interval(budget)
    band = fit.predict_interval(budget)
    assert band is not None and (budget < 1e4 or band[1] == 1.0)
