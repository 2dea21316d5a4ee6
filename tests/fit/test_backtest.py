"""A run's check of itself: the fit of its first half, asked what its last evaluation would read.
A run on the law passes it; a run whose curve is not the law's (the demo's, straight in compute)
is told so by its confidence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.errors import DataError, InputError, ScaleRLError
from scalerl.fit import fit_curve, sigmoid
from scalerl.fit.backtest import backtest
from scalerl.fit.outlook import outlook
from scalerl.spec import PREDICTION_MIN_POINTS, BudgetSpec

LAW = (0.85, 1.8, 0.0025, 0.18)  # A, B, C_mid, R0: a demo-sized run, past its midpoint by half
COMPUTE = np.linspace(0.0, 0.0064, 21)  # an evaluation every 5 of 100 steps
SE = 0.012  # mean@8 over 128 prompts near the middle


def binomial_run(seed: int, law: tuple[float, ...] = LAW) -> np.ndarray:
    """Evaluations of `law` as a run reads them: passes out of 128 x 8 samples."""
    rng = np.random.default_rng(seed)
    return rng.binomial(1024, sigmoid(COMPUTE, *law)) / 1024


def straight_run() -> np.ndarray:
    """The demo's real curve (runs/demo, seed 1): 0.18 at step 0, then straight in compute up to
    0.91, which no sigmoid in log compute fitted to its first half follows."""
    return 0.18 + (0.91 - 0.18) * COMPUTE / COMPUTE[-1]


def test_a_run_on_the_law_passes_its_backtest() -> None:
    rates = binomial_run(seed=4)
    test = backtest(COMPUTE, rates, sigma=np.full(rates.size, SE))
    assert test is not None
    # Fitted on the evaluations at compute <= 0.0032: steps 0..50, eleven of them.
    assert test.fitted_on == int((COMPUTE <= COMPUTE[-1] / 2).sum()) == 11
    assert (test.compute, test.actual) == (COMPUTE[-1], rates[-1])
    assert test.inside is True
    # The first half's curve lands near the law itself at the end.
    assert test.predicted == pytest.approx(sigmoid(COMPUTE[-1], *LAW), abs=0.05)
    assert test.to_dict()["error"] == pytest.approx(test.predicted - rates[-1])


def test_a_curve_that_is_not_the_law_s_misses_and_the_outlook_says_misfit() -> None:
    rates = straight_run()
    sigma = np.full(rates.size, SE)
    test = backtest(COMPUTE, rates, sigma=sigma)
    assert test is not None and test.interval is not None
    # The straight line keeps rising; the law through its first half bends too early.
    assert test.interval[1] < rates[-1]
    assert test.inside is False
    whole = fit_curve(COMPUTE, rates, sigma=sigma)
    said = outlook(whole, BudgetSpec(max_steps=200), step=100, compute=COMPUTE[-1], units=1,
                   backtest=test)  # fmt: skip
    assert said["confidence"] == "Misfit"
    assert said["backtest"]["inside"] is False
    # The same fit on a run on the law is OK.
    rates = binomial_run(seed=4)
    test = backtest(COMPUTE, rates, sigma=sigma)
    said = outlook(fit_curve(COMPUTE, rates, sigma=sigma), BudgetSpec(), step=100,
                   compute=COMPUTE[-1], units=1, backtest=test)  # fmt: skip
    assert said["confidence"] == "OK"


@pytest.mark.slow  # 40 backtests, each two fits with bootstrap bands: a calibration check
@pytest.mark.parametrize("with_se", [True, False])
def test_on_the_law_it_misses_about_as_often_as_a_95_percent_interval(with_se: bool) -> None:
    # 40 runs drawn from the law: a false alarm is a 95 % predictive interval that misses.
    # Without the evaluations' standard errors (a curve file without them) the first half's
    # residuals say how noisy an evaluation is; the curve's band alone would miss most times.
    def misses(rates: np.ndarray) -> bool:
        sigma = np.sqrt(rates * (1 - rates) / 1024) if with_se else None
        test = backtest(COMPUTE, rates, sigma=sigma)
        assert test is not None
        return test.inside is False

    assert sum(misses(binomial_run(seed)) for seed in range(40)) <= 6
    # binomial(40, 0.05) exceeds 6 with probability < 1.5 %; the draws are fixed by their seeds


def test_there_is_no_backtest_until_the_first_half_holds_enough_points_to_predict() -> None:
    rates = straight_run()
    # 15 evaluations to compute 0.00448: the first half (to 0.00224) holds 8, steps 0 to 35,
    # and its fit uses the 7 past the floor: one short of a prediction that is not TooEarly.
    assert PREDICTION_MIN_POINTS == 8
    assert backtest(COMPUTE[:15], rates[:15]) is None
    test = backtest(COMPUTE[:17], rates[:17])  # the half holds 9; 8 past the floor
    assert test is not None and test.fitted_on == 9
    # Evaluations spaced x4 in compute: only 64, 256 and 1024 lie past the first half's floor
    # (3 % of 1024), too few to fit at all.
    compute = np.array([0.0] + [4.0**i for i in range(8)])
    assert backtest(compute, np.linspace(0.2, 0.6, compute.size)) is None


def test_points_out_of_order_are_refused_as_the_fit_refuses_them() -> None:
    with pytest.raises(DataError, match="sorted by increasing compute"):
        backtest(COMPUTE[::-1], straight_run())


def test_standard_errors_must_match_the_points() -> None:
    with pytest.raises(InputError, match="21 standard errors"):
        backtest(COMPUTE, straight_run(), sigma=[0.01] * 20)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30),
    st.floats(1e-3, 1e4),
    st.one_of(st.none(), st.floats(0.0, 0.05)),
)
def test_any_curve_gives_a_backtest_nothing_or_a_clear_error(
    rates: list[float], end: float, se: float | None
) -> None:
    compute = np.linspace(0.0, end, len(rates))
    sigma = None if se is None else np.full(len(rates), se)
    try:
        test = backtest(compute, rates, sigma=sigma, bootstrap=20)
    except ScaleRLError:
        return
    if test is None:
        return
    assert 1 <= test.fitted_on < len(rates)
    assert math.isfinite(test.predicted) and test.actual == rates[-1]
    if test.interval is not None:
        assert test.interval[0] <= test.interval[1]
        assert test.inside == (test.interval[0] <= test.actual <= test.interval[1])
