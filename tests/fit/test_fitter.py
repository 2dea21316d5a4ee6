"""The fitter: R0 modes, min_compute, bootstrap intervals, grid search, bad input."""

import json
import math
import statistics
import warnings

import numpy as np
import pytest
from scipy.optimize import OptimizeWarning, curve_fit

from scalerl.errors import DataError, FitError, InputError
from scalerl.fit import PAPER_A_GRID, FitResult, fit_curve, sample_curve, sigmoid
from scalerl.fit.grid import coarse_b
from scalerl.fit.problem import Problem
from scalerl.fit.solver import solve_batched

TRUTH = {"A": 0.61, "B": 1.92, "C_mid": 2542.0, "R0": 0.2}


def curve(n: int = 60, noise: float = 0.006, seed: int = 0, per_eval: float = 145.0):
    compute = np.arange(n) * per_eval
    return compute, sample_curve(compute, **TRUTH, noise=noise, seed=seed)


def test_r0_fixed_is_the_pass_rate_at_the_smallest_compute() -> None:
    compute, pass_rate = curve()
    result = fit_curve(compute, pass_rate, bootstrap=0)
    assert result.R0 == pass_rate[0]
    assert result.r0_mode == "fixed"


def test_r0_fit_recovers_r0_from_points_above_min_compute() -> None:
    compute, pass_rate = curve(n=80, noise=0.002)
    pass_rate[0] = 0.5  # a wrong first point: a fitted R0 must not depend on it
    result = fit_curve(compute, pass_rate, r0="fit", min_compute=290.0, bootstrap=0)
    assert result.r0_mode == "fit"
    assert result.R0 == pytest.approx(0.2, abs=0.01)
    assert result.A == pytest.approx(0.61, abs=0.01)


def test_r0_given_as_a_number_is_kept() -> None:
    compute, pass_rate = curve()
    assert fit_curve(compute, pass_rate, r0=0.25, bootstrap=0).R0 == 0.25


def test_min_compute_excludes_points_from_the_fit_but_r0_still_comes_from_them() -> None:
    compute, pass_rate = curve(n=60)
    result = fit_curve(compute, pass_rate, min_compute=1500.0, bootstrap=0)
    below = int((compute < 1500.0).sum())
    assert (result.points, result.excluded) == (60 - below, below)
    assert result.fit_range[0] >= 1500.0
    assert result.R0 == pass_rate[0]


def test_points_below_min_compute_do_not_move_the_fit() -> None:
    compute, pass_rate = curve(n=60)
    scrambled = pass_rate.copy()
    scrambled[1:10] = 0.9  # compute 145..1305, all below 1500
    first = fit_curve(compute, pass_rate, min_compute=1500.0, bootstrap=0)
    second = fit_curve(compute, scrambled, min_compute=1500.0, bootstrap=0)
    assert (second.A, second.B, second.C_mid) == (first.A, first.B, first.C_mid)


def test_default_min_compute_is_3_percent_of_the_largest_compute() -> None:
    compute, pass_rate = curve(n=60)
    result = fit_curve(compute, pass_rate, bootstrap=0)
    assert result.min_compute == pytest.approx(0.03 * compute[-1])
    assert result.excluded == int((compute < 0.03 * compute[-1]).sum())


def test_fit_works_in_any_compute_unit() -> None:
    # A CPU demo run measured in process-hours: the same curve, compute divided by 10^5.
    compute, pass_rate = curve(n=60)
    big = fit_curve(compute, pass_rate, bootstrap=0)
    tiny = fit_curve(compute / 1e5, pass_rate, bootstrap=0)
    assert tiny.A == pytest.approx(big.A, abs=1e-6)
    assert tiny.B == pytest.approx(big.B, rel=1e-5)
    assert tiny.C_mid == pytest.approx(big.C_mid / 1e5, rel=1e-5)


def test_fit_finds_low_asymptotes_below_the_papers_grid() -> None:
    compute = np.arange(50) * 0.01
    pass_rate = sample_curve(compute, 0.12, 2.0, 0.1, 0.02, noise=0.002, seed=1)
    result = fit_curve(compute, pass_rate, bootstrap=0)
    assert PAPER_A_GRID.min() == 0.45
    assert result.A == pytest.approx(0.12, abs=0.01)


def test_refinement_beats_the_grids_best_cell() -> None:
    compute, pass_rate = curve(n=60)
    result = fit_curve(compute, pass_rate, min_compute=1500.0, bootstrap=0)
    used = compute >= 1500.0
    # the best the grid alone could do: A on the 0.005 grid, B and C_mid exact — still worse
    on_grid = round(result.A / 0.005) * 0.005
    sse_grid = np.sum(
        (sigmoid(compute[used], on_grid, result.B, result.C_mid, result.R0) - pass_rate[used]) ** 2
    )
    assert result.sse <= sse_grid
    assert not math.isclose(result.A, on_grid, abs_tol=1e-6)


def test_grid_b_fits_agree_with_curve_fit_per_cell() -> None:
    """The vectorised B fit of every (A, C_mid) cell finds what scipy's curve_fit finds."""
    compute, pass_rate = curve(n=60)
    c, y, r0 = compute[compute >= 1500], pass_rate[compute >= 1500], float(pass_rate[0])
    cells = [(0.60, 2000.0), (0.61, 2500.0), (0.65, 3000.0), (0.70, 4000.0), (0.55, 1800.0)]
    a = np.array([x for x, _ in cells])
    log_c_mid = np.log([m for _, m in cells])
    w = np.ones(c.size)  # unweighted, as curve_fit without sigma
    b0 = np.array(
        [coarse_b(c, y, w, r0, a[i : i + 1], log_c_mid[i : i + 1])[0, 0] for i in range(5)]
    )
    base = np.column_stack([a, b0, log_c_mid, np.full(5, r0)])
    problem = Problem(c, y[None, :], base, np.array([False, True, False, False]), w)
    solution = solve_batched(problem, b0[:, None], np.array([1e-6]), np.array([np.inf]))
    assert solution.ok.all()
    ours = solution.theta[:, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        for i, (cell_a, cell_m) in enumerate(cells):
            (theirs,), _ = curve_fit(
                lambda x, b, a=cell_a, m=cell_m: sigmoid(x, a, b, m, r0), c, y, p0=[1.0]
            )
            assert ours[i] == pytest.approx(theirs, rel=1e-4), (cell_a, cell_m)


def test_bootstrap_interval_contains_the_truth_on_a_clean_curve() -> None:
    compute, pass_rate = curve(n=60, noise=0.002, seed=5)
    result = fit_curve(compute, pass_rate, min_compute=1500.0, bootstrap=200, seed=0)
    lo, hi = result.A_interval
    assert lo <= 0.61 <= hi and hi - lo < 0.02
    lo, hi = result.C_mid_interval
    assert lo <= 2542.0 <= hi
    assert result.A_interval[0] <= result.A <= result.A_interval[1]


def test_bootstrap_is_deterministic_for_a_seed_and_varies_with_it() -> None:
    compute, pass_rate = curve()
    first = fit_curve(compute, pass_rate, seed=7)
    again = fit_curve(compute, pass_rate, seed=7)
    other = fit_curve(compute, pass_rate, seed=8)
    assert (first.A_interval, first.C_mid_interval) == (again.A_interval, again.C_mid_interval)
    np.testing.assert_array_equal(first.draws, again.draws)
    # A's interval is the profile's (no resampling); the bootstrap's draws follow the seed.
    assert not np.array_equal(first.draws, other.draws)
    assert first.A == other.A  # the point estimate does not depend on the bootstrap


def test_bootstrap_zero_gives_no_intervals() -> None:
    compute, pass_rate = curve()
    result = fit_curve(compute, pass_rate, bootstrap=0)
    assert result.A_interval is None and result.C_mid_interval is None
    assert result.predict_interval(10_000.0) is None


def test_predict_returns_a_float_for_a_number_and_an_array_for_an_array() -> None:
    compute, pass_rate = curve()
    result = fit_curve(compute, pass_rate, bootstrap=50)
    assert isinstance(result.predict(5000.0), float)
    assert result.predict(np.array([0.0, 5000.0])).shape == (2,)
    assert result.predict(0.0) == result.R0
    lo, hi = result.predict_interval(50_000.0)
    assert lo <= result.predict(50_000.0) <= hi


def test_a_predictive_interval_adds_one_evaluations_noise_to_the_curves_band() -> None:
    # Every replicate on the same curve: the band is that curve, and what one evaluation there
    # reads is it plus normal noise, so the interval is the normal quantiles around it.
    params = np.array([0.6, 1.5, math.log(1000.0), 0.2])
    draws = np.tile([0.6, 1.5, 1000.0, 0.2], (200, 1))
    result = FitResult.build(
        params=params, draws=draws, level=0.95, points=10, excluded=0, sse=0.0,
        min_compute=0.0, r0_mode="fixed", fit_range=(0.0, 1.0),
    )  # fmt: skip
    at = result.predict(2000.0)
    assert result.predict_interval(2000.0) == pytest.approx((at, at))
    lo, hi = result.predict_interval(2000.0, observation_se=0.01)
    z = statistics.NormalDist().inv_cdf(0.975)
    assert lo == pytest.approx(at - z * 0.01, abs=0.0015)
    assert hi == pytest.approx(at + z * 0.01, abs=0.0015)
    # On a real fit it holds the curve's band.
    compute, pass_rate = curve()
    fitted = fit_curve(compute, pass_rate, bootstrap=50)
    band, wider = fitted.predict_interval(50_000.0), fitted.predict_interval(50_000.0, 0.01)
    assert wider[0] < band[0] <= band[1] < wider[1]


def test_to_dict_is_json_ready() -> None:
    compute, pass_rate = curve()
    data = json.loads(json.dumps(fit_curve(compute, pass_rate, bootstrap=20).to_dict()))
    for key in ("A", "B", "C_mid", "R0", "A_interval", "C_mid_interval", "points"):
        assert key in data
    assert len(data["A_interval"]) == 2 and data["points"] + data["excluded"] == 60


def test_a_fixed_pins_the_asymptote() -> None:
    compute, pass_rate = curve()
    assert fit_curve(compute, pass_rate, a_fixed=0.65, bootstrap=10).A == 0.65


def test_a_flat_curve_fits_without_crashing() -> None:
    compute = np.arange(20) * 10.0
    result = fit_curve(compute, np.full(20, 0.3), bootstrap=20)
    assert np.allclose(result.predict(compute[1:]), 0.3, atol=1e-3)


@pytest.mark.parametrize(
    ("compute", "pass_rate", "error", "message"),
    [
        ([0, 1, 2], [0.1, 0.2, 0.3], FitError, "only 2 points"),
        ([0, 1, 2, 3, 4], [0.1, np.nan, 0.3, 0.4, 0.5], DataError, "point 1: pass_rate is nan"),
        ([0, 1, np.inf, 3, 4], [0.1, 0.2, 0.3, 0.4, 0.5], DataError, "point 2: compute is inf"),
        ([0, -1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4, 0.5], DataError, "compute -1 is negative"),
        ([0, 1, 2, 3, 4], [0.1, 0.2, 1.3, 0.4, 0.5], DataError, "pass_rate 1.3 is outside [0, 1]"),
        ([0, 1, 3, 2, 4], [0.1, 0.2, 0.3, 0.4, 0.5], DataError, "point 3: compute 2 is smaller"),
        ([0, 1, 2], [0.1, 0.2], DataError, "equal length"),
        ([], [], DataError, "no points"),
    ],
    ids=["too-few", "nan", "inf", "negative", "above-one", "unsorted", "lengths", "empty"],
)
def test_bad_input_raises_one_line_naming_the_problem(compute, pass_rate, error, message) -> None:
    with pytest.raises(error) as caught:
        fit_curve(compute, pass_rate, min_compute=0.5)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_too_few_points_counts_only_those_above_min_compute() -> None:
    compute, pass_rate = curve(n=20)
    with pytest.raises(FitError, match=r"only 3 points .* min_compute 2465 .*at least 4"):
        fit_curve(compute, pass_rate, min_compute=compute[-3])


@pytest.mark.parametrize(
    "options",
    [{"min_compute": -1.0}, {"r0": "guess"}, {"r0": 1.5}, {"bootstrap": -1}, {"level": 1.0}],
)
def test_bad_options_raise_input_error(options) -> None:
    compute, pass_rate = curve(n=20)
    with pytest.raises(InputError):
        fit_curve(compute, pass_rate, **options)


def test_equal_standard_errors_weigh_as_no_standard_errors() -> None:
    compute, pass_rate = curve(n=30)
    plain = fit_curve(compute, pass_rate, bootstrap=50)
    alike = fit_curve(compute, pass_rate, bootstrap=50, sigma=np.full(compute.size, 0.01))
    assert (alike.A, alike.B, alike.C_mid) == pytest.approx((plain.A, plain.B, plain.C_mid))
    # The intervals differ only in the noise they assume: the stated 0.01 is more than the
    # points scatter (0.006), and A's profile interval takes the larger of the two.
    assert alike.A_interval[0] <= plain.A_interval[0] <= plain.A_interval[1] <= alike.A_interval[1]
    np.testing.assert_allclose(alike.draws, plain.draws)
    assert alike.to_dict()["weighted"] and not plain.to_dict()["weighted"]


def test_points_weigh_by_their_standard_errors() -> None:
    # The truth, measured precisely, except four late points that are far off and say so (a
    # standard error 20 times the others'): weighted, the fit follows the sure points.
    truth = {"A": 0.61, "B": 1.9, "C_mid": 2500.0, "R0": 0.2}
    compute = np.linspace(0.0, 50_000.0, 41)
    pass_rate = np.asarray(sigmoid(compute, *truth.values()), dtype=float)
    sigma = np.full(compute.size, 0.002)
    off = [34, 36, 38, 40]
    pass_rate[off] -= 0.08
    sigma[off] = 0.04
    plain = fit_curve(compute, pass_rate, bootstrap=0)
    weighted = fit_curve(compute, pass_rate, bootstrap=0, sigma=sigma)
    assert abs(weighted.A - truth["A"]) < 0.005 < abs(plain.A - truth["A"])


@pytest.mark.parametrize(
    "sigma", [[0.01] * 5, [0.01] * 9 + [-0.01], [0.01] * 9 + [math.nan], ["x"] * 10]
)
def test_bad_standard_errors_are_refused(sigma: list[object]) -> None:
    compute, pass_rate = np.linspace(0, 10, 10), np.linspace(0.2, 0.6, 10)
    with pytest.raises(InputError, match="sigma"):
        fit_curve(compute, pass_rate, sigma=sigma)  # type: ignore[arg-type]
