"""The paper's comparison rule: higher A wins unless the A are within 0.02; then higher B at the
mean A wins."""

import dataclasses

import numpy as np
import pytest

from scalerl.fit import compare, fit_curve, sample_curve

COMPUTE = np.arange(60) * 145.0


def run(a: float, b: float, c_mid: float = 2542.0, seed: int = 0):
    pass_rate = sample_curve(COMPUTE, a, b, c_mid, 0.2, noise=0.004, seed=seed)
    return fit_curve(COMPUTE, pass_rate, bootstrap=0), (COMPUTE, pass_rate)


def test_higher_asymptote_wins_when_a_differs_by_more_than_the_margin() -> None:
    fit_a, data_a = run(a=0.61, b=2.4)  # more efficient ...
    fit_b, data_b = run(a=0.66, b=1.6, seed=1)  # ... but a higher ceiling wins
    result = compare(fit_a, fit_b, data_a, data_b)
    assert result.rule == "asymptote" and result.winner == "b"
    assert result.B_a is None and result.A_shared is None
    assert "b is better: higher asymptote" in result.verdict()


def test_higher_b_at_the_shared_asymptote_wins_when_a_is_within_the_margin() -> None:
    fit_a, data_a = run(a=0.60, b=1.5)
    fit_b, data_b = run(a=0.61, b=2.3, seed=1)
    assert abs(fit_a.A - fit_b.A) <= 0.02
    result = compare(fit_a, fit_b, data_a, data_b)
    assert result.rule == "efficiency" and result.winner == "b"
    assert result.A_shared == pytest.approx((fit_a.A + fit_b.A) / 2)
    assert result.B_b > result.B_a
    # the B compared is the refit at the shared A, not the original fit's B
    refit = fit_curve(
        *data_a, min_compute=fit_a.min_compute, r0=fit_a.R0, bootstrap=0, a_fixed=result.A_shared
    )
    assert result.B_a == refit.B


def test_swapping_the_runs_swaps_the_winner() -> None:
    fit_a, data_a = run(a=0.60, b=1.5)
    fit_b, data_b = run(a=0.61, b=2.3, seed=1)
    assert compare(fit_b, fit_a, data_b, data_a).winner == "a"


def test_a_difference_of_exactly_the_margin_counts_as_equal() -> None:
    fit, data = run(a=0.60, b=2.0)
    high = dataclasses.replace(fit, A=0.61)
    low = dataclasses.replace(fit, A=0.59)  # 0.61 - 0.59 = 0.020000000000000018 in floating point
    assert compare(high, low, data, data).rule == "efficiency"
    assert compare(high, dataclasses.replace(fit, A=0.589), data, data).rule == "asymptote"


def test_the_same_run_twice_is_a_tie() -> None:
    fit, data = run(a=0.60, b=2.0)
    result = compare(fit, fit, data, data)
    assert result.winner == "tie"
    assert result.verdict().startswith("tie")
    assert set(result.to_dict()) >= {"winner", "rule", "A_a", "A_b", "A_shared", "B_a", "B_b"}


def test_the_verdict_prints_the_gap_with_the_digits_that_show_it_beyond_the_margin() -> None:
    # 0.0204 at three decimals read "differ by 0.020 > 0.02".
    from scalerl.fit.compare import Comparison

    close = Comparison("a", "asymptote", 0.8204, 0.8, 0.02)
    assert "differ by 0.0204 > 0.02" in close.verdict()
    far = Comparison("b", "asymptote", 0.6, 0.75, 0.02)
    assert "differ by 0.150 > 0.02" in far.verdict()
