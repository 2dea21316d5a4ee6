"""Intervals that say what the points cannot tell (issue 32): the interval on A and the
prediction widen when the curve has not bent yet, a ceiling the data bound only from below reads
`A >= x`, a predictive interval stays within [0, 1] with the noise an evaluation at that pass rate
has (F10), and a flat run gets no zero-width "95 %" interval (F11)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.fit import FitResult, fit_curve, sigmoid
from scalerl.fit.noise import ObservationNoise

LAST = 1.0
COMPUTE = np.linspace(0.0, LAST, 13)  # step 0 and 12 evaluations
TRIALS = 1024  # mean@8 over 128 prompts


def evaluations(law: tuple[float, float, float, float], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Pass rates of `law` (A, B, C_mid, R0) as a run reads them, and their binomial SEs."""
    rng = np.random.default_rng(seed)
    rates = rng.binomial(TRIALS, sigmoid(COMPUTE, *law)) / TRIALS
    return rates, np.sqrt(rates * (1 - rates) / TRIALS)


@settings(max_examples=6, deadline=None)
@given(
    a=st.floats(0.6, 0.9),
    b=st.floats(1.3, 2.5),
)
def test_the_interval_widens_as_c_mid_moves_past_the_data(a: float, b: float) -> None:
    # The same law with its midpoint at 0.3 of the data (bent well before the end) or 3 times
    # beyond it (still in its first rise), read exactly, each point with the standard error a
    # mean@8 over 128 prompts has: what the points can say about A, noise draws aside (whether
    # a noisy draw's interval holds the truth is coverage, bench/calibration.py's business).
    fits = {}
    for factor in (0.3, 3.0):
        rates = sigmoid(COMPUTE, a, b, factor * LAST, 0.2)
        se = np.sqrt(rates * (1 - rates) / TRIALS)
        fits[factor] = fit_curve(COMPUTE, rates, sigma=se, min_compute=0.0)
    bent, early = fits[0.3], fits[3.0]
    assert bent.A_interval is not None and early.A_interval is not None
    assert early.A_interval[1] - early.A_interval[0] > bent.A_interval[1] - bent.A_interval[0]
    # So does what an evaluation at ten times the data's compute would read.
    reads = {factor: fit.predictive_interval(10 * LAST) for factor, fit in fits.items()}
    assert reads[3.0] is not None and reads[0.3] is not None
    assert reads[3.0][1] - reads[3.0][0] > reads[0.3][1] - reads[0.3][0]
    # Bent: A is pinned (whether the truth is inside is a matter of coverage, measured by
    # bench/calibration.py, not of every draw). Not yet bent: only a floor under the ceiling.
    assert bent.A_at_least is None
    assert early.A_at_least is not None and early.A_at_least <= a


def test_a_straight_early_curve_reads_a_lower_bound_not_a_tight_interval() -> None:
    # The demo's curve: straight in compute from 0.18 at step 0 (no sigmoid in log compute
    # bends through it), its first half fitted, as a user reads the prediction half-way.
    compute = np.linspace(0.0, 0.0064, 21)[:11]
    rates = 0.18 + (0.91 - 0.18) * compute / 0.0064
    result = fit_curve(compute, rates, sigma=np.full(rates.size, 0.012))
    assert result.A_at_least is not None
    assert result.A_interval is not None and result.A_interval[1] == 1.0
    # The bound is the smallest asymptote the points allow: above the highest point read.
    assert rates.max() <= result.A_at_least <= result.A_interval[0] + 1e-12
    assert result.to_dict()["A_atLeast"] == result.A_at_least
    # The law's band at the run's end holds every curve the points allow, up to A = 1 ...
    law_only = dataclasses.replace(result, drift_probe=None)
    band = law_only.predict_interval(0.0064)
    assert band is not None
    for A, B, C_mid, R0 in result.profile:
        assert band[0] - 1e-12 <= sigmoid(0.0064, A, B, C_mid, R0) <= band[1] + 1e-12
    assert result.profile[:, 0].max() == 1.0
    # ... yet none of them reaches where the straight run goes (0.91). The forecast moves up
    # only as far as the run's own earlier fits missed beyond their own intervals
    # (scalerl.fit.drift): here they held, so the forecast is the law, and the run's half-run
    # check is what says it missed (Misfit, tests/fit/test_backtest.py).
    assert band[1] < 0.91
    chosen = result.forecast_model()
    assert chosen["model"] == ("law" if chosen["weight"] == 0.0 else "law+drift")
    forecast = result.predict_interval(0.0064)
    assert forecast is not None and forecast[1] >= band[1] - 1e-12
    assert law_only.predict(0.0064) <= result.forecast(0.0064) < 0.91
    # Within the data the forecast is the law.
    assert result.forecast(0.0032) == result.predict(0.0032)


def test_a_bent_curve_has_no_lower_bound_only() -> None:
    rates, se = evaluations((0.7, 2.0, 0.2, 0.2), seed=3)
    result = fit_curve(COMPUTE, rates, sigma=se)
    assert result.A_at_least is None and result.to_dict()["A_atLeast"] is None
    assert result.A_interval is not None and result.A_interval[1] < 0.8


def test_noise_read_from_binomial_ses_is_the_binomial_one() -> None:
    # mean@16 over 1,000 prompts (the paper's): 16,000 trials per evaluation.
    trials = 16_000
    rates = np.array([0.2, 0.35, 0.5, 0.62, 0.7, 0.76])
    se = np.sqrt(rates * (1 - rates) / trials)
    noise = ObservationNoise.estimate(rates, sigma=se)
    assert noise.c == pytest.approx(1 / trials, rel=1e-12)
    assert float(noise.se(0.999)) == pytest.approx(math.sqrt(0.999 * 0.001 / trials), rel=1e-9)
    assert float(noise.se(0.5)) == pytest.approx(math.sqrt(0.25 / trials), rel=1e-9)
    # At 1.0 the formula gives 0; the floor is the SE of a rate one trial from the edge.
    one_off = 1 - 1 / trials
    assert float(noise.se(1.0)) == pytest.approx(math.sqrt(one_off * (1 - one_off) / trials))


def test_the_noise_added_is_an_evaluation_s_at_the_predicted_rate_and_stays_below_one() -> None:
    # Every replicate on one curve that ends at 0.999 (audit S8: 32 prompts x 4 per evaluation,
    # last read 0.906 +- 0.024): what an evaluation there reads scatters like a binomial at 0.999.
    params = np.array([1.0, 2.0, math.log(0.03), 0.18])
    result = FitResult.build(
        params=params, draws=np.tile([1.0, 2.0, 0.03, 0.18], (50, 1)), level=0.95, points=20,
        excluded=0, sse=0.0, min_compute=0.0, r0_mode="fixed", fit_range=(0.0, 0.2),
    )  # fmt: skip
    at = result.predict(1.0)
    assert 0.998 < at < 1.0
    noise = ObservationNoise(c=1 / 128, floor=0.0)
    reads = result.predict_interval(1.0, noise)
    assert reads is not None
    lo, hi = reads
    z = statistics.NormalDist().inv_cdf(0.975)
    assert lo == pytest.approx(at - z * math.sqrt(at * (1 - at) / 128), rel=1e-9)
    assert hi == 1.0  # at + z se would pass 1
    # The last evaluation's SE would have given [0.95, 1.05].
    assert hi - lo < z * math.sqrt(0.906 * 0.094 / 128)
    # On a fit of such a run, any interval stays within [0, 1].
    rng = np.random.default_rng(5)
    compute = np.linspace(0.0, 0.2, 21)
    rates = rng.binomial(128, sigmoid(compute, 1.0, 2.0, 0.03, 0.18)) / 128
    fitted = fit_curve(compute, rates, sigma=np.sqrt(rates * (1 - rates) / 128))
    for budget in (0.4, 16000.0):
        reads = fitted.predictive_interval(budget)
        assert reads is not None
        lo, hi = reads
        assert 0.0 <= lo <= fitted.predict(budget) <= hi <= 1.0


def test_a_zero_standard_error_does_not_collapse_the_predictive_interval() -> None:
    rates, se = evaluations((0.98, 2.0, 0.2, 0.3), seed=1)
    rates[-4:], se[-4:] = 1.0, 0.0  # every prompt agreed
    result = fit_curve(COMPUTE, rates, sigma=se)
    band, reads = result.predict_interval(2 * LAST), result.predictive_interval(2 * LAST)
    assert band is not None and reads is not None
    assert reads[1] - reads[0] > band[1] - band[0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_flat_run_gets_no_zero_width_interval(seed: int) -> None:
    # Audit S9: 9 points, flat at 0.2 with noise 0.012; each draw's interval held nothing but
    # one grid value before.
    rng = np.random.default_rng(seed)
    compute = np.linspace(0.0, 0.02, 9)
    rates = 0.2 + rng.normal(0.0, 0.012, 9)
    rates[0] = 0.2
    result = fit_curve(compute, rates, min_compute=0.0, sigma=np.full(9, 0.012))
    assert result.A_interval is not None
    lo, hi = result.A_interval
    assert hi - lo > 0.05
    # The level the points measured, within its noise, is inside.
    level, noise = float(rates[1:].mean()), 0.012 / math.sqrt(8)
    assert lo <= level + 2 * noise and hi >= level - 2 * noise
