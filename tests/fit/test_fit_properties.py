"""Property tests: any curve gives a FitResult that keeps its promises, or a ScaleRLError that
says why (issue 7: "a fitter that never crashes").

Curves are small (1-8 points) and nasty: pass rates quantized to multiples of 1/128 (mean@16 over
8 prompts), flat, falling, single-valued, at exactly 0 and 1, ties in compute, a point at compute
0, compute scales from 1e-6 to 1e7. Most examples use small grids (the same code paths, a hundred
times cheaper); a smaller set runs the default grids and a 200-replicate bootstrap, as the CLI does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalerl.errors import DataError, FitError, InputError
from scalerl.fit import compare, fit_curve, sigmoid
from scalerl.fit.result import FitResult

EXPECTED_ERRORS = (FitError, DataError, InputError)
QUANTUM = 1.0 / 128.0
SMALL_A_GRID = np.linspace(0.05, 1.0, 20)


def examples(count: int) -> settings:
    """`count` examples; no deadline (a shared 2-core machine), no example database in the tree."""
    return settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


SIX_POINTS = (
    [0.0338, 0.0504, 0.0644, 0.0803, 0.0850, 0.1012],
    [0.2266, 0.2031, 0.2813, 0.3125, 0.2813, 0.2891],
)


@dataclass(frozen=True)
class Case:
    compute: np.ndarray
    pass_rate: np.ndarray
    options: dict[str, Any]


def _quantize(values: np.ndarray) -> np.ndarray:
    return np.clip(np.round(values / QUANTUM) * QUANTUM, 0.0, 1.0)


@st.composite
def pass_rates(draw: st.DrawFn, compute: np.ndarray) -> np.ndarray:
    """Pass rates of one of several shapes, all multiples of 1/128 in [0, 1]."""
    n = compute.size
    shape = draw(st.sampled_from(["sigmoid", "any", "rising", "falling", "flat", "extremes"]))
    if shape == "sigmoid":  # the law plus evaluation noise, then quantized
        r0, a = sorted(draw(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=2)))
        b = draw(st.floats(0.3, 6.0))
        c_mid = float(compute.max()) * draw(st.floats(0.05, 3.0)) or 1.0
        noise = draw(st.lists(st.floats(-0.06, 0.06), min_size=n, max_size=n))
        return _quantize(sigmoid(compute, a, b, c_mid, r0) + np.array(noise))
    counts = draw(st.lists(st.integers(0, 128), min_size=n, max_size=n))
    rates = np.array(counts, dtype=float) * QUANTUM
    if shape == "rising":
        return np.sort(rates)
    if shape == "falling":
        return np.sort(rates)[::-1].copy()
    if shape == "flat":
        return np.full(n, rates[0])
    if shape == "extremes":  # only 0 and 1
        return np.round(rates)
    return rates


@st.composite
def curves(draw: st.DrawFn, min_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(min_size, 8))
    scale = 10.0 ** draw(st.integers(-6, 7))
    # Integer steps on a grid of 20 give ties; the first may be 0 (the R0 evaluation).
    steps = sorted(draw(st.lists(st.integers(0, 20), min_size=n, max_size=n)))
    compute = np.array(steps, dtype=float) * scale
    return compute, draw(pass_rates(compute))


@st.composite
def options(draw: st.DrawFn, compute: np.ndarray) -> dict[str, Any]:
    top = float(compute.max())
    min_compute = draw(st.one_of(st.none(), st.just(0.0), st.floats(0.0, max(top, 1e-300) * 1.2)))
    r0 = draw(st.one_of(st.sampled_from(["fixed", "fit"]), st.floats(0.0, 1.0)))
    return {"min_compute": min_compute, "r0": r0, "seed": draw(st.integers(0, 2**32))}


@st.composite
def small_grid_cases(draw: st.DrawFn) -> Case:
    compute, pass_rate = draw(curves())
    opts = draw(options(compute))
    top = max(float(compute.max()), 1e-300)
    opts |= {
        "bootstrap": draw(st.sampled_from([0, 10, 30])),
        "a_grid": SMALL_A_GRID,
        "c_mid_grid": np.geomspace(top / 100.0, 2.0 * top, 8),
    }
    return Case(compute, pass_rate, opts)


@st.composite
def default_grid_cases(draw: st.DrawFn) -> Case:
    compute, pass_rate = draw(curves(min_size=4))
    return Case(compute, pass_rate, draw(options(compute)) | {"bootstrap": 200})


def fit_or_error(case: Case) -> FitResult | None:
    """The fit, or None after checking that the error is one of ours, with a reason."""
    try:
        return fit_curve(case.compute, case.pass_rate, **case.options)
    except EXPECTED_ERRORS as err:
        assert str(err).strip()
        return None


def check_result(result: FitResult, case: Case) -> None:
    """What a FitResult promises, whatever the data."""
    values = (result.A, result.B, result.C_mid, result.R0, result.sse)
    assert all(math.isfinite(v) for v in values), values
    assert 0.0 <= result.A <= 1.0 and 0.0 <= result.R0 <= 1.0
    assert result.B > 0.0 and result.C_mid > 0.0 and result.sse >= 0.0
    # `points` counts the trained evaluations fitted (compute > 0, at or past the floor).
    used = case.compute >= result.min_compute
    assert result.points >= 4 and result.points == int((used & (case.compute > 0)).sum())
    assert result.excluded == int((~used).sum())
    r0 = case.options["r0"]
    if r0 == "fixed":
        assert result.R0 == np.mean(case.pass_rate[case.compute == case.compute[0]])
    elif r0 != "fit":
        assert result.R0 == r0
    predicted = result.predict(case.compute)
    assert np.all(np.isfinite(predicted)) and np.all((predicted >= 0.0) & (predicted <= 1.0))
    check_bootstrap(result, case.options["bootstrap"])
    json.dumps(result.to_dict(), allow_nan=False)  # the CLI's --json never prints NaN


def check_bootstrap(result: FitResult, replicates: int) -> None:
    kept = result.draws.shape[0]
    assert kept + result.bootstrap_failed == replicates
    intervals = (result.A_interval, result.B_interval, result.C_mid_interval)
    if kept == 0:
        assert intervals == (None, None, None)
        return
    assert np.isfinite(result.draws).all()
    for lo, hi in intervals:
        assert math.isfinite(lo) and math.isfinite(hi) and lo <= hi
    assert 0.0 <= result.A_interval[0] and result.A_interval[1] <= 1.0
    assert result.B_interval[0] > 0.0 and result.C_mid_interval[0] > 0.0


@examples(1500)
@pytest.mark.slow  # hypothesis runs hundreds of fits
@given(small_grid_cases())
def test_any_small_curve_fits_or_says_why(case: Case) -> None:
    result = fit_or_error(case)
    if result is not None:
        check_result(result, case)


@examples(150)
@pytest.mark.slow
@given(default_grid_cases())
def test_any_small_curve_fits_or_says_why_with_default_grids_and_bootstrap(case: Case) -> None:
    result = fit_or_error(case)
    if result is not None:
        check_result(result, case)


@examples(300)
@pytest.mark.slow
@given(small_grid_cases(), small_grid_cases())
def test_compare_gives_a_verdict_or_says_why(case_a: Case, case_b: Case) -> None:
    fit_a, fit_b = fit_or_error(case_a), fit_or_error(case_b)
    if fit_a is None or fit_b is None:
        return
    try:
        verdict = compare(
            fit_a, fit_b, (case_a.compute, case_a.pass_rate), (case_b.compute, case_b.pass_rate)
        )
    except EXPECTED_ERRORS as err:
        assert str(err).strip()
        return
    assert verdict.winner in ("a", "b", "tie")
    if verdict.rule == "efficiency":
        assert verdict.B_a > 0 and verdict.B_b > 0


def test_the_six_point_curve_that_crashed_the_bootstrap_now_fits() -> None:
    # Issue 7's reproducer: `scalerl fit --min-compute 0` printed numpy's LinAlgError.
    for r0 in ("fixed", "fit"):
        case = Case(*(np.array(v) for v in SIX_POINTS), {"min_compute": 0.0, "r0": r0})
        result = fit_curve(case.compute, case.pass_rate, min_compute=0.0, r0=r0)
        check_result(result, Case(case.compute, case.pass_rate, case.options | {"bootstrap": 200}))
        assert result.A_interval is not None and result.bootstrap_failed < 20


def test_a_four_point_curve_that_hit_a_singular_matrix_fits() -> None:
    # Found by a scan of random small curves: the bootstrap's damped normal equations of one
    # replicate were exactly singular (damping had shrunk to 1e-17 on a rank-deficient Jacobian).
    compute = [0.0349, 0.1157, 0.1173, 0.1181]
    pass_rate = [0.3125, 0.421875, 0.390625, 0.3671875]
    result = fit_curve(compute, pass_rate, min_compute=0.0)
    assert result.A_interval is not None


def test_a_curve_whose_c_mid_ran_off_to_overflow_fits() -> None:
    # A falling, noisy curve with R0 fitted: ln C_mid can run past 709, where math.exp overflows.
    compute = [0.05, 0.0534, 0.0668, 0.0768, 0.0863, 0.1083]
    pass_rate = [0.3203125, 0.234375, 0.2578125, 0.3203125, 0.3203125, 0.2734375]
    result = fit_curve(compute, pass_rate, min_compute=0.0, r0="fit")
    assert math.isfinite(result.C_mid)
