"""Fitting the sigmoidal law to a run's evaluations: the paper's grid search, a continuous
refinement, and a residual bootstrap for intervals on A and C_mid.

The procedure (paper, Sec. "fitting"; our additions marked):

1. R0. `r0="fixed"` (default): the pass rate at the smallest compute — real runs evaluate at step 0,
   compute 0, before training. That point is usually below `min_compute`: it is excluded from the
   fit but still defines R0. `r0="fit"`: R0 is a free parameter, started from that value. A float
   fixes R0 to it.
2. Points with compute < `min_compute` are excluded. Paper: ~1.5k GPU-h (about one epoch) of a
   50k GPU-h fit range, i.e. 3 %; our default is 3 % of the largest compute, so it means the same
   for runs in any unit (GPU-h on a cluster, process-hours on a laptop).
3. Grid: A over 0.005 steps, C_mid over 100 linearly spaced values; for each cell B is fitted by
   least squares and the cell with the lowest SSE is kept. Paper: A in {0.450, ..., 0.800},
   C_mid in [100, 40000] GPU-h. Ours: A from min(0.450, max(R0, highest pass rate)) up to 1.0,
   so the paper's A grid is a subset and tiny runs with low asymptotes are covered; C_mid in
   [h/100, h] with h = 2 x the largest fitted compute, so the grid follows the data's unit.
   The B fits of all cells run together (`solver.solve_batched`, Levenberg-Marquardt like
   `curve_fit`), each started from the best of a coarse B grid rather than curve_fit's B = 1, so
   every cell converges in a few steps.
4. (ours) Refinement: all free parameters are refined continuously from the best cell with
   `scipy.optimize.least_squares` (bounds 0 <= A <= 1, B > 0, C_mid > 0, 0 <= R0 <= 1). The paper's
   reported C_mid values lie off its grid, so its code refines too.
5. (ours) Bootstrap: residuals of the fit are resampled with replacement (rescaled by
   sqrt(n / (n - p)) for the degrees of freedom used) and added to the fitted curve; each replicate
   is refitted from the full-data solution, all replicates at once, without a grid. Resampling
   residuals rather than points keeps every replicate's compute range — the points at the largest
   compute decide the asymptote, and resampling points would drop them from some replicates.
   A measured R0 (`r0="fixed"`) is one noisy evaluation too, so each replicate also perturbs it by
   a resampled residual; `r0="fit"` refits it; a given float stays. Intervals are percentiles
   (nominal 95 %; on Table 1's curves with noise 0.006 they cover the truth about 90 % of the time:
   percentile intervals of a nonlinear fit from ~50 points run a little narrow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import least_squares
from scipy.special import expit

from scalerl.errors import FitError, InputError
from scalerl.fit.law import gradient, log_compute
from scalerl.fit.points import check_points
from scalerl.fit.result import FitResult
from scalerl.fit.solver import solve_batched

R0Mode = Literal["fixed", "fit"]

PAPER_A_GRID = np.round(np.arange(0.450, 0.800 + 1e-9, 0.005), 3)
PAPER_C_MID_RANGE = (100.0, 40000.0)
A_STEP = 0.005
C_MID_GRID_SIZE = 100
MIN_COMPUTE_FRACTION = 0.03
MIN_POINTS = 4
COARSE_B = np.geomspace(0.05, 20.0, 40)

# The parameter vector everywhere below: (A, B, ln C_mid, R0).
LOWER = np.array([0.0, 1e-6, -np.inf, 0.0])
UPPER = np.array([1.0, np.inf, np.inf, 1.0])
IntArray = NDArray[np.intp]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class _Problem:
    """Least-squares residuals of the law: one or many targets (bootstrap) or base rows (grid)."""

    compute: FloatArray  # (n,)
    targets: FloatArray  # (1, n) shared, or (K, n): one row per problem
    base: FloatArray  # (1, 4) shared, or (K, 4): values of the parameters that are not free
    free: NDArray[np.bool_]  # (4,)

    def __call__(self, theta: FloatArray, rows: IntArray) -> tuple[FloatArray, FloatArray]:
        full = np.array(self.base if self.base.shape[0] == 1 else self.base[rows], dtype=float)
        full = np.broadcast_to(full, (theta.shape[0], 4)).copy()
        full[:, self.free] = theta
        A, B, log_c_mid, R0 = (full[:, i : i + 1] for i in range(4))
        parts = gradient(self.compute, A, B, log_c_mid, R0)
        targets = self.targets if self.targets.shape[0] == 1 else self.targets[rows]
        resid = R0 + (A - R0) * parts[0] - targets
        jac = np.stack([p for p, f in zip(parts, self.free, strict=True) if f], axis=-1)
        return resid, jac


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
) -> FitResult:
    """Fit R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) to evaluations sorted by compute.

    `a_fixed` pins A (the comparison rule refits at a shared A). `a_grid` and `c_mid_grid`
    replace the default grids (e.g. `PAPER_A_GRID`). `bootstrap=0` skips the intervals.
    Raises DataError for bad points, InputError for bad options, FitError when too few points
    remain.
    """
    c, y = check_points(compute, pass_rate)
    _check_options(min_compute, r0, bootstrap, level, a_fixed)
    cutoff = MIN_COMPUTE_FRACTION * float(c[-1]) if min_compute is None else float(min_compute)
    r0_value = float(np.mean(y[c == c[0]])) if isinstance(r0, str) else float(r0)
    used = c >= cutoff
    _check_enough(c, used, cutoff)
    free = np.array([a_fixed is None, True, True, r0 == "fit"])
    grid_a = np.array([a_fixed]) if a_fixed is not None else _a_grid(a_grid, r0_value, y[used])
    grid_c = _c_mid_grid(c_mid_grid, c[used])
    start = _grid_search(c[used], y[used], r0_value, grid_a, grid_c)
    best = _refine(c[used], y[used], start, free)
    problem = _Problem(c[used], y[used][None, :], best[None, :], free)
    resid = problem(best[free][None, :], np.zeros(1, dtype=np.intp))[0][0]
    draws = _bootstrap(problem, best, resid, bootstrap, seed, jitter_r0=r0 == "fixed")
    return FitResult.build(
        params=best,
        draws=draws,
        level=level,
        points=int(used.sum()),
        excluded=int((~used).sum()),
        sse=float(resid @ resid),
        min_compute=cutoff,
        r0_mode="fit" if r0 == "fit" else "fixed",
        fit_range=(float(c[used][0]), float(c[used][-1])),
    )


def _check_options(
    min_compute: float | None, r0: object, bootstrap: int, level: float, a_fixed: float | None
) -> None:
    if min_compute is not None and not (math.isfinite(min_compute) and min_compute >= 0):
        raise InputError(f"min_compute must be a finite number >= 0, got {min_compute}")
    given = isinstance(r0, (int, float)) and not isinstance(r0, bool) and 0.0 <= r0 <= 1.0
    if r0 not in ("fixed", "fit") and not given:
        raise InputError(f"r0 must be 'fixed', 'fit' or a number in [0, 1], got {r0!r}")
    if bootstrap < 0:
        raise InputError(f"bootstrap must be >= 0 replicates, got {bootstrap}")
    if not 0.0 < level < 1.0:
        raise InputError(f"level must be in (0, 1), got {level}")
    if a_fixed is not None and not 0.0 <= a_fixed <= 1.0:
        raise InputError(f"a_fixed must be in [0, 1], got {a_fixed}")


def _check_enough(c: FloatArray, used: NDArray[np.bool_], cutoff: float) -> None:
    usable = int((used & (c > 0)).sum())
    if usable < MIN_POINTS:
        raise FitError(
            f"only {usable} point{'s' if usable != 1 else ''} with compute > 0 at or above "
            f"min_compute {cutoff:g} (of {c.size}); the fit needs at least {MIN_POINTS}"
        )


def _a_grid(a_grid: ArrayLike | None, r0: float, y: FloatArray) -> FloatArray:
    """Candidate asymptotes: the paper's 0.450..0.800 extended to cover max(R0, max y)..1.0."""
    if a_grid is not None:
        grid = np.asarray(a_grid, dtype=float).ravel()
    else:
        top = math.floor(max(r0, float(y.max())) / A_STEP) * A_STEP
        start = min(float(PAPER_A_GRID[0]), top)
        grid = np.round(np.arange(start, 1.0 + 1e-9, A_STEP), 3)
    # A = R0 makes the curve flat and B meaningless: only asymptotes above R0 are candidates.
    grid = grid[(grid > r0) & (grid <= 1.0)]
    if grid.size == 0:
        raise FitError(
            f"R0 = {r0:g} leaves no room below 1.0 (or the A grid) for the curve to rise"
        )
    return grid


def _c_mid_grid(c_mid_grid: ArrayLike | None, c: FloatArray) -> FloatArray:
    """Candidate midpoints, linearly spaced over [h/100, h]; h = 2 x the largest fitted compute."""
    if c_mid_grid is not None:
        grid = np.asarray(c_mid_grid, dtype=float).ravel()
        if grid.size == 0 or not np.all(grid > 0):
            raise InputError("c_mid_grid must hold positive values")
        return grid
    high = 2.0 * float(c[-1])
    return np.linspace(high / C_MID_GRID_SIZE, high, C_MID_GRID_SIZE)


def _grid_search(
    c: FloatArray, y: FloatArray, r0: float, grid_a: FloatArray, grid_c: FloatArray
) -> FloatArray:
    """The paper's grid: best B for every (A, C_mid) cell, then the cell with the lowest SSE."""
    log_c_mid = np.log(grid_c)
    cells_a, cells_lc = (g.ravel() for g in np.meshgrid(grid_a, log_c_mid, indexing="ij"))
    b0 = _coarse_b(c, y, r0, grid_a, log_c_mid).ravel()
    base = np.column_stack([cells_a, b0, cells_lc, np.full(cells_a.size, r0)])
    problem = _Problem(c, y[None, :], base, np.array([False, True, False, False]))
    b = solve_batched(problem, b0[:, None], LOWER[1:2], UPPER[1:2], max_iter=50)
    resid = problem(b, np.arange(b.shape[0]))[0]
    sse = np.einsum("kn,kn->k", resid, resid)
    best = int(np.nanargmin(sse))
    return np.array([cells_a[best], b[best, 0], cells_lc[best], r0])


def _coarse_b(
    c: FloatArray, y: FloatArray, r0: float, grid_a: FloatArray, log_c_mid: FloatArray
) -> FloatArray:
    """For every (A, C_mid) cell, the best B of a coarse log-spaced grid: the start of its B fit.

    For fixed B and C_mid the law is linear in A - R0, so SSE(A) = T - 2 a S1 + a^2 S2 gives every
    A's SSE from two sums, and the whole (A, B, C_mid) cube costs one (B, C_mid, n) evaluation.
    """
    log_c = log_compute(c)
    z = COARSE_B[:, None, None] * (log_c[None, None, :] - log_c_mid[None, :, None])
    s = expit(z)  # (nB, nC, n)
    dev = y - r0
    s1, s2, total = s @ dev, np.einsum("bcn,bcn->bc", s, s), float(dev @ dev)
    a = (grid_a - r0)[:, None, None]
    sse = total - 2.0 * a * s1[None] + a * a * s2[None]  # (nA, nB, nC)
    return COARSE_B[np.argmin(sse, axis=1)]  # (nA, nC)


def _refine(c: FloatArray, y: FloatArray, start: FloatArray, free: NDArray[np.bool_]) -> FloatArray:
    """Continuous least-squares refinement of the free parameters from the best grid cell."""
    problem = _Problem(c, y[None, :], start[None, :], free)
    lo, hi = LOWER[free], UPPER[free]
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
    except (ValueError, np.linalg.LinAlgError) as err:
        raise FitError(f"the refinement of the grid's best fit failed: {err}") from None
    best = start.copy()
    best[free] = solution.x
    return best


def _bootstrap(
    problem: _Problem,
    best: FloatArray,
    resid: FloatArray,
    replicates: int,
    seed: int,
    *,
    jitter_r0: bool,
) -> FloatArray:
    """Parameters (A, B, C_mid, R0) refitted on `replicates` residual-bootstrap samples.

    With `jitter_r0`, R0 — one measured pass rate, as noisy as any other — also gets a resampled
    residual per replicate; holding it still would understate the spread of A and C_mid.
    """
    if replicates == 0:
        return np.empty((0, 4))
    n, p = resid.size, int(problem.free.sum())
    fitted = problem.targets[0] + resid
    centred = (resid - resid.mean()) * math.sqrt(n / max(n - p, 1))
    rng = np.random.default_rng(seed)
    noise = centred[rng.integers(0, n, size=(replicates, n + 1))]
    targets = fitted[None, :] - noise[:, :n]
    base = np.tile(best, (replicates, 1))
    if jitter_r0:
        base[:, 3] = np.clip(best[3] - noise[:, n], 0.0, 1.0)
    batch = _Problem(problem.compute, targets, base, problem.free)
    theta0 = np.tile(best[problem.free], (replicates, 1))
    theta = solve_batched(batch, theta0, LOWER[problem.free], UPPER[problem.free])
    draws = base
    draws[:, problem.free] = theta
    draws[:, 2] = np.exp(draws[:, 2])
    return draws[np.isfinite(draws).all(axis=1)]
