"""The sigmoidal law, Eq. 1 of the paper."""

import json
import subprocess
import sys

import numpy as np
import pytest

from scalerl.fit.law import compute_to_reach, gradient, sample_curve, sigmoid

PARAMS = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.2}


def test_law_is_halfway_between_r0_and_a_at_c_mid() -> None:
    assert sigmoid(2542.0, **PARAMS) == pytest.approx((0.2 + 0.61) / 2, abs=1e-12)


def test_law_tends_to_a_at_large_compute() -> None:
    assert sigmoid(1e12, **PARAMS) == pytest.approx(0.61, abs=1e-9)


def test_law_is_r0_at_zero_compute() -> None:
    assert sigmoid(0.0, **PARAMS) == 0.2


def test_law_agrees_with_eq1_written_out() -> None:
    c = np.array([1.0, 100.0, 1500.0, 2542.0, 10_000.0, 1e6])
    a, b, c_mid, r0 = 0.61, 1.92, 2542.0, 0.2
    expected = r0 + (a - r0) / (1.0 + (c_mid / c) ** b)
    np.testing.assert_allclose(sigmoid(c, **PARAMS), expected, rtol=1e-12)


def test_law_for_large_compute_follows_the_power_law_tail() -> None:
    # Paper: for C >> C_mid, R ~ A - D / C^B with D = (A - R0) C_mid^B.
    c = 1e6
    d = (0.61 - 0.2) * 2542.0**1.92
    assert sigmoid(c, **PARAMS) == pytest.approx(0.61 - d / c**1.92, rel=1e-6)


def test_law_neither_overflows_nor_warns_at_extremes() -> None:
    with np.errstate(all="raise"):
        r = sigmoid(np.array([0.0, 1e-300, 1e300]), 0.7, 50.0, 10.0, 0.1)
    np.testing.assert_allclose(r, [0.1, 0.1, 0.7])


def test_compute_to_reach_inverts_the_law() -> None:
    c = np.array([100.0, 2542.0, 9000.0])
    np.testing.assert_allclose(compute_to_reach(sigmoid(c, **PARAMS), **PARAMS), c, rtol=1e-9)


def test_compute_to_reach_is_nan_beyond_the_asymptote() -> None:
    assert np.isnan(compute_to_reach(0.62, **PARAMS))
    assert np.isnan(compute_to_reach(0.2, **PARAMS))


def test_gradient_matches_finite_differences() -> None:
    c = np.array([0.0, 500.0, 2542.0, 8000.0])
    theta = np.array([0.61, 1.92, np.log(2542.0), 0.2])

    def law(t: np.ndarray) -> np.ndarray:
        return sigmoid(c, t[0], t[1], np.exp(t[2]), t[3])

    analytic = np.stack(gradient(c, *theta), axis=-1)
    for i in range(4):
        step = np.zeros(4)
        step[i] = 1e-6
        numeric = (law(theta + step) - law(theta - step)) / 2e-6
        np.testing.assert_allclose(analytic[:, i], numeric, atol=1e-7)


def test_sample_curve_is_seeded_and_stays_in_unit_interval() -> None:
    c = np.linspace(0, 10_000, 50)
    first = sample_curve(c, **PARAMS, noise=0.5, seed=3)
    np.testing.assert_array_equal(first, sample_curve(c, **PARAMS, noise=0.5, seed=3))
    assert not np.array_equal(first, sample_curve(c, **PARAMS, noise=0.5, seed=4))
    assert first.min() >= 0.0 and first.max() <= 1.0


def test_importing_fit_pulls_in_no_matplotlib_torch_or_other_scalerl_parts() -> None:
    code = (
        "import json, sys, scalerl.fit; "
        "heavy = ('scalerl', 'matplotlib', 'torch'); "
        "print(json.dumps([m for m in sys.modules if m.startswith(heavy)]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    outside = [
        m
        for m in loaded
        if not m.startswith("scalerl.fit")
        and m not in ("scalerl", "scalerl.errors", "scalerl.datafile")  # the points files
    ]
    assert outside == []
