"""Fitting the sigmoidal law to a run's evaluations: the paper's grid search, a continuous
refinement, a residual bootstrap for intervals on B and C_mid, and a profile of A for A's
interval and the prediction band.

The procedure (paper, Sec. "fitting"; our additions marked):

1. R0. `r0="fixed"` (default): the pass rate at the smallest compute — real runs evaluate at step 0,
   compute 0, before training. That point is usually below `min_compute`: it is excluded from the
   fit but still defines R0. `r0="fit"`: R0 is a free parameter, started from that value. A float
   fixes R0 to it.
2. Points with compute < `min_compute` are excluded. Paper: ~1.5k GPU-h (about one epoch) of a
   50k GPU-h fit range, i.e. 3 %; our default is 3 % of the largest compute, so it means the same
   for runs in any unit (GPU-h on a cluster, process-hours on a laptop).
3. Grid (`scalerl.fit.grid`): A over 0.005 steps, C_mid over 100 values; for each cell B is
   fitted by least squares and the cell with the lowest SSE is kept. Paper: A in {0.450, ...,
   0.800}, C_mid in [100, 40000] GPU-h. Ours: A from min(0.450, max(R0, highest pass rate)) up to
   1.0, so the paper's A grid is a subset and tiny runs with low asymptotes are covered (and down
   to the lowest point when a run fell below R0); C_mid over 100 log-spaced values from a tenth
   of the smallest positive fitted compute to 100 x the largest, so the grid follows the data's
   unit and holds the midpoints of curves that have not bent yet (a grid ending at 2 x the data,
   linear in compute, made half-run fits of such curves bend early and underpredict).
   The B fits of all cells run together (`solver.solve_batched`, Levenberg-Marquardt like
   `curve_fit`; solver.py says why not scipy per cell), each started from the best of a coarse B
   grid rather than curve_fit's B = 1, so every cell converges in a few steps.
4. (ours) Refinement: all free parameters are refined continuously from the best cell with
   `scipy.optimize.least_squares` (bounds 0 <= A <= 1, B > 0, 0 <= R0 <= 1, and C_mid within a
   factor e^30 ~ 1e13 of the fitted compute range: a flat or falling curve would otherwise push
   C_mid towards infinity). The paper's reported C_mid values lie off its grid, so its code
   refines too.
   (ours) With `sigma` (each evaluation's standard error, e.g. a mean@k's from its per-prompt
   means), every step weighs a point by 1 / its standard error: a pass rate near 0 or 1 varies
   less than one near 0.5, and the curve should follow the surer points. Weights are relative
   to the median standard error, and one below a quarter of it counts as a quarter (a pass rate
   that every prompt agreed on measures 0). Without `sigma` all points weigh alike.
5. (ours) Bootstrap: residuals of the fit (weighted, with `sigma`) are resampled with replacement
   (rescaled by sqrt(n / (n - p)) for the degrees of freedom used) and added to the fitted curve
   (each at its point's own scale); each replicate is refitted from the full-data solution, all
   replicates at once, without a grid. Resampling residuals rather than points keeps every
   replicate's compute range — the points at the largest compute decide the asymptote, and
   resampling points would drop them from some replicates. A measured R0 (`r0="fixed"`) is one noisy
   evaluation too, so each replicate also perturbs it by a resampled residual; `r0="fit"` refits it;
   a given float stays. Intervals are percentiles (nominal 95 %; on Table 1's curves with noise
   0.006 they cover the truth about 90 % of the time: percentile intervals of a nonlinear fit from
   ~50 points run a little narrow).
   A replicate whose refit fails (does not converge, or to non-finite values: it happens on a
   handful of noisy points) is dropped and counted in `FitResult.bootstrap_failed`; when all fail
   the fit is returned without intervals.
6. (ours) Profile of A (`scalerl.fit.profile`): for every A of the grid the other parameters are
   refitted from that row's best cell (all rows at once); the A whose weighted SSE stays within
   the likelihood-ratio threshold make A's interval, and their curves widen the prediction band.
   A bootstrap from the best fit sees only the noise about it; before the bend the points allow
   a far wider range of ceilings, and this says so (`A_at_least` when only a floor is known).
7. (ours) `scalerl.fit.noise` reads one evaluation's noise at any pass rate from the fitted
   points' standard errors and residuals: the predictive interval's.
8. (ours) `scalerl.fit.drift` measures, when a prediction beyond the data first asks for it, how
   far the run's own earlier fits (rolling origins) missed where it went, and moves and widens
   predictions beyond the data by that (`FitResult.forecast`, `predict_interval`): real runs
   leave the law's shape, and its intervals alone were too low and too sure on them.

Any input gives a FitResult or a ScaleRLError that says why (DataError for bad points, InputError
for bad options, FitError when the law cannot be fitted); nothing else is raised.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import least_squares

from scalerl.errors import FitError, InputError
from scalerl.fit.drift import Drift, DriftInputs, measure
from scalerl.fit.grid import Grid, candidate_a, candidate_c_mid, grid_search
from scalerl.fit.noise import ObservationNoise
from scalerl.fit.points import check_points
from scalerl.fit.problem import Box, FloatArray, Problem
from scalerl.fit.profile import Profile, select, threshold
from scalerl.fit.result import FitResult
from scalerl.fit.solver import solve_batched

R0Mode = Literal["fixed", "fit"]

MIN_COMPUTE_FRACTION = 0.03
MIN_POINTS = 4
# The law has three shape parameters (A, B, C_mid): points at fewer distinct compute values
# cannot pin them, whatever their number.
MIN_DISTINCT_COMPUTE = 3
# ln C_mid may leave the fitted compute range by this much (e^30 ~ 1e13) on either side.
C_MID_SPAN = 30.0
# A standard error below this fraction of the median one weighs as if it were that fraction.
SIGMA_FLOOR = 0.25


def fit_curve(
    compute: ArrayLike,
    pass_rate: ArrayLike,
    *,
    min_compute: float | None = None,
    r0: R0Mode | float = "fixed",
    bootstrap: int = 200,
    seed: int = 0,
    level: float = 0.95,
    a_grid: ArrayLike | None = None,
    c_mid_grid: ArrayLike | None = None,
    a_fixed: float | None = None,
    sigma: ArrayLike | None = None,
) -> FitResult:
    """Fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) to evaluations sorted by compute.

    `a_fixed` pins A (the comparison rule refits at a shared A). `a_grid` and `c_mid_grid`
    replace the default grids (e.g. `grid.PAPER_A_GRID`). `bootstrap=0` skips the intervals.
    `sigma`: each point's standard error; the fit weighs points by it (see the module's text).
    Raises DataError for bad points, InputError for bad options, FitError when too few points
    remain or the law cannot be fitted to them; never anything else.
    """
    c, y = check_points(compute, pass_rate)
    _check_options(min_compute, r0, bootstrap, seed, level, a_fixed)
    se = _standard_errors(sigma, c.size)
    inputs = DriftInputs(c, y, se, r0, None if min_compute is None else float(min_compute))
    typical = _typical(se)
    weights = _weights(se, typical, c.size)
    cutoff = compute_floor(float(c[-1]), min_compute)
    r0_value = float(np.mean(y[c == c[0]])) if isinstance(r0, str) else float(r0)
    r0_weight = float(np.mean(weights[c == c[0]]))
    used = c >= cutoff
    _check_enough(c, used, cutoff)
    c, y, weights = c[used], y[used], weights[used]
    free = np.array([a_fixed is None, True, True, r0 == "fit"])
    grid_a = candidate_a(a_grid, r0_value, y) if a_fixed is None else np.array([float(a_fixed)])
    grid_c = candidate_c_mid(c_mid_grid, c)
    # Overflow and nan are expected on the way (a cell far from the data, B driven to a step)
    # and are handled by the finiteness checks below rather than reported as warnings.
    with np.errstate(all="ignore"):
        box = _bounds(c)
        grid = grid_search(c, y, weights, r0_value, grid_a, grid_c, box)
        best = _refine(c, y, weights, grid.start, free, box)
        problem = Problem(c, y[None, :], best[None, :], free, weights)
        resid = problem(best[free][None, :], np.zeros(1, dtype=np.intp))[0][0]
        _check_estimate(best, resid)
        fixed_r0 = r0_weight if r0 == "fixed" else None
        draws, failed = _bootstrap(problem, best, resid, box, int(bootstrap), int(seed), fixed_r0)
        sse = float(resid @ resid)
        kept = None
        if bootstrap and a_fixed is None:
            kept = _profile(problem, grid, best, sse, box, float(level), typical)
    noise = ObservationNoise.estimate(
        y,
        sigma=None if se is None else se[used],
        residuals=resid / weights,
        dof=int(c.size - free.sum()),
    )
    result = FitResult.build(
        params=best,
        draws=draws,
        level=float(level),
        profile=kept,
        noise=noise,
        points=int((c > 0).sum()),  # trained evaluations past the floor: not the step-0 one
        excluded=int((~used).sum()),
        sse=sse,
        min_compute=cutoff,
        r0_mode="fit" if r0 == "fit" else "fixed",
        fit_range=(float(c[0]), float(c[-1])),
        bootstrap_failed=failed,
        sigma=se,
    )
    if not bootstrap or a_fixed is not None:
        return result  # no intervals to widen, or a refit at a shared A (the comparison rule's)
    return dataclasses.replace(result, drift_probe=_drift_probe(inputs, result))


def _drift_probe(inputs: DriftInputs, result: FitResult) -> Callable[[], Drift | None]:
    """Measures `result`'s drift (`scalerl.fit.drift`) when first asked: a handful of refits
    that most fits never need."""

    def probe() -> Drift | None:
        curve = np.asarray(result.predict(inputs.compute), dtype=float)
        return measure(inputs, curve, refit=fit_curve, floor=compute_floor)

    return probe


def compute_floor(largest: float, min_compute: float | None) -> float:
    """The compute below which a fit leaves evaluations out: `min_compute`, or by default
    MIN_COMPUTE_FRACTION of the `largest` compute."""
    return MIN_COMPUTE_FRACTION * largest if min_compute is None else float(min_compute)


def _standard_errors(sigma: ArrayLike | None, n: int) -> FloatArray | None:
    """`sigma` as n finite standard errors >= 0 (a copy), or an InputError saying what is
    wrong; None without it."""
    if sigma is None:
        return None
    try:
        se = np.array(sigma, dtype=float).ravel()
    except (TypeError, ValueError) as err:
        raise InputError(f"sigma must be an array of numbers ({err})") from None
    if se.size != n or not np.all(np.isfinite(se) & (se >= 0)):
        raise InputError(f"sigma must hold {n} finite standard errors >= 0, one per point")
    return se


def _typical(se: FloatArray | None) -> float:
    """The median positive standard error (0 without any)."""
    if se is None or not np.any(se > 0):
        return 0.0
    return float(np.median(se[se > 0]))


def _weights(se: FloatArray | None, typical: float, n: int) -> FloatArray:
    """Each point's weight, 1 / its standard error relative to the `typical` one (all 1 without
    standard errors). A standard error below SIGMA_FLOOR of it (a pass rate of 0 or 1 measures
    0: all prompts agreed) counts as that floor, so that no point pins the curve alone."""
    if se is None or typical == 0.0:
        return np.ones(n)
    weights: FloatArray = typical / np.maximum(se, SIGMA_FLOOR * typical)
    return weights


def _real(value: object) -> float | None:
    """`value` as a float when it is a real number (not a bool), else None."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return None


def _check_options(
    min_compute: object, r0: object, bootstrap: object, seed: object, level: object, a_fixed: object
) -> None:
    if min_compute is not None and not _within(min_compute, 0.0, math.inf):
        raise InputError(f"min_compute must be a finite number >= 0, got {min_compute!r}")
    if not (isinstance(r0, str) and r0 in ("fixed", "fit")) and not _within(r0, 0.0, 1.0):
        raise InputError(f"r0 must be 'fixed', 'fit' or a number in [0, 1], got {r0!r}")
    for name, count in (("bootstrap", bootstrap), ("seed", seed)):
        if not isinstance(count, numbers.Integral) or isinstance(count, bool) or count < 0:
            raise InputError(f"{name} must be an integer >= 0, got {count!r}")
    if not _within(level, 0.0, 1.0) or _real(level) in (0.0, 1.0):
        raise InputError(f"level must be in (0, 1), got {level!r}")
    if a_fixed is not None and not _within(a_fixed, 0.0, 1.0):
        raise InputError(f"a_fixed must be in [0, 1], got {a_fixed!r}")


def _within(value: object, low: float, high: float) -> bool:
    """A finite real number in [low, high]."""
    number = _real(value)
    return number is not None and math.isfinite(number) and low <= number <= high


def _check_enough(c: FloatArray, used: NDArray[np.bool_], cutoff: float) -> None:
    usable = c[used & (c > 0)]
    if usable.size < MIN_POINTS:
        raise FitError(
            f"only {usable.size} point{'s' if usable.size != 1 else ''} with compute > 0 at or "
            f"above min_compute {cutoff:g} (of {c.size}); the fit needs at least {MIN_POINTS}"
        )
    distinct = np.unique(usable).size
    if distinct < MIN_DISTINCT_COMPUTE:
        raise FitError(
            f"the {usable.size} points with compute > 0 at or above min_compute {cutoff:g} sit "
            f"at only {distinct} distinct compute value{'s' if distinct != 1 else ''}; the fit "
            f"needs at least {MIN_DISTINCT_COMPUTE}"
        )


def _bounds(c: FloatArray) -> Box:
    """Bounds of (A, B, ln C_mid, R0). C_mid stays within e^C_MID_SPAN of the positive compute
    fitted: beyond that the curve is constant over the data, and on a flat or falling curve an
    unbounded C_mid runs off towards overflow."""
    positive = c[c > 0]
    log_low = math.log(float(positive[0])) - C_MID_SPAN
    log_high = math.log(float(positive[-1])) + C_MID_SPAN
    return np.array([0.0, 1e-6, log_low, 0.0]), np.array([1.0, np.inf, log_high, 1.0])


def _profile(
    problem: Problem,
    grid: Grid,
    best: FloatArray,
    best_sse: float,
    box: Box,
    level: float,
    typical_se: float,
) -> Profile:
    """The profile of A (`scalerl.fit.profile`): each grid A's best cell, its other free
    parameters refitted continuously (all A at once), kept within the likelihood threshold
    (whose noise variance is never below `typical_se` squared)."""
    cell = np.argmin(grid.sse, axis=1)
    rows = np.arange(grid.a.size)
    base = np.column_stack(
        [grid.a, grid.b[rows, cell], grid.log_c_mid[cell], np.full(grid.a.size, best[3])]
    )
    free = problem.free.copy()
    free[0] = False
    batch = Problem(problem.compute, problem.targets, base, free, problem.weights)
    solution = solve_batched(batch, base[:, free], box[0][free], box[1][free])
    base[:, free] = solution.theta
    resid = batch(solution.theta, rows)[0]
    sse = np.einsum("kn,kn->k", resid, resid)
    n, p = problem.compute.size, int(problem.free.sum())
    limit = threshold(best_sse, n, p, typical_se * typical_se, level)
    c = problem.compute
    return select(base, sse, best, best_sse, limit, (float(c[0]), float(c[-1])), float(grid.a[-1]))


def _refine(
    c: FloatArray,
    y: FloatArray,
    w: FloatArray,
    start: FloatArray,
    free: NDArray[np.bool_],
    box: Box,
) -> FloatArray:
    """Continuous least-squares refinement of the free parameters from the best grid cell."""
    problem = Problem(c, y[None, :], start[None, :], free, w)
    lo, hi = box[0][free], box[1][free]
    # least_squares wants a strictly feasible start; grid cells may sit on a bound (A = 1).
    x0 = np.clip(start[free], lo + 1e-9, hi - 1e-9)
    one = np.zeros(1, dtype=np.intp)
    try:
        solution = least_squares(
            lambda x: problem(x[None, :], one)[0][0],
            x0,
            jac=lambda x: problem(x[None, :], one)[1][0],
            bounds=(lo, hi),
            method="trf",
        )
    except (ValueError, ArithmeticError, np.linalg.LinAlgError) as err:
        raise FitError(f"the refinement of the grid's best fit failed: {err}") from None
    best = start.copy()
    best[free] = solution.x
    return best


def _check_estimate(best: FloatArray, resid: FloatArray) -> None:
    """The promise of FitResult: finite A, B, C_mid > 0, R0 and SSE, or a FitError."""
    c_mid = float(np.exp(best[2]))  # may overflow to inf (under the caller's errstate)
    if not (np.isfinite(best).all() and np.isfinite(resid).all() and 0.0 < c_mid < math.inf):
        shown = ", ".join(f"{v:.4g}" for v in best)
        raise FitError(f"the fit did not reach finite parameters (A, B, ln C_mid, R0 = {shown})")


def _bootstrap(
    problem: Problem,
    best: FloatArray,
    resid: FloatArray,
    box: Box,
    replicates: int,
    seed: int,
    r0_weight: float | None,
) -> tuple[FloatArray, int]:
    """Parameters (A, B, C_mid, R0) refitted on `replicates` residual-bootstrap samples, and the
    number of replicates whose refit failed (dropped from the draws).

    The residuals are weighted ones (each divided by its point's relative standard error), so
    they are alike; a resampled one goes back to a point at that point's own scale.
    With a measured R0 (`r0_weight`, the weight of the point it was read from), R0 — one
    evaluation, as noisy as any other — also gets a resampled residual per replicate; holding it
    still would understate the spread of A and C_mid.
    """
    if replicates == 0:
        return np.empty((0, 4)), 0
    n, p, w = resid.size, int(problem.free.sum()), problem.weights
    fitted = problem.targets[0] + resid / w
    centred = (resid - resid.mean()) * math.sqrt(n / max(n - p, 1))
    rng = np.random.default_rng(seed)
    noise = centred[rng.integers(0, n, size=(replicates, n + 1))]
    targets = fitted[None, :] - noise[:, :n] / w
    base = np.tile(best, (replicates, 1))
    if r0_weight is not None:
        base[:, 3] = np.clip(best[3] - noise[:, n] / r0_weight, 0.0, 1.0)
    batch = Problem(problem.compute, targets, base, problem.free, w)
    theta0 = np.tile(best[problem.free], (replicates, 1))
    free = problem.free
    solution = solve_batched(batch, theta0, box[0][free], box[1][free])
    draws = base
    draws[:, free] = solution.theta
    draws[:, 2] = np.exp(draws[:, 2])
    kept = solution.ok & np.isfinite(draws).all(axis=1) & (draws[:, 2] > 0)
    return draws[kept], replicates - int(kept.sum())
