"""A batched Levenberg-Marquardt solver: many small, independent least-squares problems at once.

The fitter solves thousands of tiny problems — one B per (A, C_mid) grid cell, one full refit per
bootstrap replicate. A Python loop over scipy calls costs about a millisecond each; stacking the
problems and stepping them together in numpy costs a few milliseconds per iteration for all of
them. Box bounds are kept by projecting each trial point onto the box, which is enough for
problems started near their solution (our bootstrap) or in one dimension (our grid).

Why not `scipy.optimize.least_squares` (issue 7 asked us to prefer it unless measured otherwise)?
Measured on Table 1's 8B curve (100 evaluations, 89 fitted), CPU seconds on our shared 2-core
machine, same process, best of repeats:

- grid, 11,100 (A, C_mid) cells, one B each: least_squares per cell (started from the coarse-B
  grid) ~27 s, curve_fit per cell from B = 1 (the paper's way) ~110 s; batched ~1-2 s.
- bootstrap, 200 refits of (A, B, C_mid): least_squares per replicate 0.43 s (0.53 s on 44
  points); batched 0.007 s.

A fit with a 200-replicate interval would take tens of seconds instead of about one, so we keep
this solver, and make it safe for any input instead: every problem's step is solved in Marquardt's
scaled coordinates with a floor on the damping (so the damped matrix is never singular, even when
the Jacobian is rank-deficient: a handful of points, a flat stretch, B so steep that the curve is a
step), a trial with non-finite residuals or Jacobian is never accepted, and each problem reports
whether it converged to finite parameters instead of raising. The single refinement of the best
grid cell, where one call is cheap, does use least_squares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]
BoolArray = NDArray[np.bool_]

# fun(theta (m, p), rows (m,)) -> residuals (m, n), jacobian (m, n, p) of problems `rows`.
Residuals = Callable[[FloatArray, IntArray], tuple[FloatArray, FloatArray]]

# Damping is floored here: in scaled coordinates (unit diagonal) the damped matrix then has every
# eigenvalue >= MIN_DAMPING and a condition number <= ~p / MIN_DAMPING, far from singular in
# float64, while the step stays a Gauss-Newton step to within 1e-9 near the solution.
MIN_DAMPING = 1e-9
MAX_DAMPING = 1e12


class Solution(NamedTuple):
    """Best parameters per problem, and which problems converged to finite parameters."""

    theta: FloatArray  # (K, p)
    ok: BoolArray  # (K,)


def solve_batched(
    fun: Residuals,
    theta0: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
    *,
    max_iter: int = 200,
    ftol: float = 1e-8,
    xtol: float = 1e-8,
) -> Solution:
    """Minimise sum(residuals**2) independently for every row of `theta0` (shape (K, p)).

    `ftol` and `xtol` are scipy least_squares' defaults. On a handful of noisy points some
    problems lie in a long, curved valley (B barely determined, A near 1) where Levenberg-Marquardt
    creeps: 200 steps let nearly all of them arrive.

    Converges a problem when a step lowers its SSE by less than `ftol` relative, or moves its
    parameters by less than `xtol` relative, or when no step lowers it any more (the damping
    explodes: a flat or degenerate problem at its best point). A problem is not `ok` when its
    start or result is not finite or it used up `max_iter` steps; its row of `theta` then holds
    the best point found (possibly the start). Never raises for numerical reasons.
    """
    with np.errstate(all="ignore"):  # non-finite values are tracked below, not warned about
        theta = np.clip(np.array(theta0, dtype=float), lower, upper)
        rows = np.arange(theta.shape[0])
        resid, jac = fun(theta, rows)
        sse = np.einsum("kn,kn->k", resid, resid)
        finite = _finite(theta, resid, jac)
        converged = np.zeros(rows.size, dtype=bool)
        damping = np.full(rows.size, 1e-3)
        active = rows[finite]
        for _ in range(max_iter):
            if active.size == 0:
                break
            done = _iterate(fun, active, theta, resid, jac, sse, damping, lower, upper, ftol, xtol)
            converged[active[done]] = True
            active = active[~done]
    return Solution(theta, finite & converged & np.isfinite(theta).all(axis=1))


def _iterate(
    fun: Residuals,
    active: IntArray,
    theta: FloatArray,
    resid: FloatArray,
    jac: FloatArray,
    sse: FloatArray,
    damping: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
    ftol: float,
    xtol: float,
) -> BoolArray:
    """One damped step for the `active` problems, updating the arrays in place; which are done."""
    step = _bounded_step(theta[active], resid[active], jac[active], damping[active], lower, upper)
    trial = np.clip(theta[active] + step, lower, upper)
    t_resid, t_jac = fun(trial, active)
    t_sse = np.einsum("kn,kn->k", t_resid, t_resid)
    # nan compares False: a trial with any non-finite value is treated as a failed step.
    better = (t_sse < sse[active]) & _finite(trial, t_resid, t_jac)
    moved = np.abs(trial - theta[active]).max(axis=1)
    scale = np.abs(theta[active]).max(axis=1) + xtol
    done: BoolArray = (better & (sse[active] - t_sse <= ftol * sse[active] + 1e-300)) | (
        moved <= xtol * scale
    )
    done |= damping[active] > MAX_DAMPING
    keep = active[better]
    theta[keep], resid[keep], jac[keep], sse[keep] = (
        trial[better],
        t_resid[better],
        t_jac[better],
        t_sse[better],
    )
    lowered = np.maximum(damping[active] / 10.0, MIN_DAMPING)
    damping[active] = np.where(better, lowered, damping[active] * 10.0)
    return done


def _bounded_step(
    theta: FloatArray,
    resid: FloatArray,
    jac: FloatArray,
    damping: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
) -> FloatArray:
    """The damped step, with parameters that sit on a bound and would step out of it held there.

    Projecting such a step onto the box also shortens the other parameters' moves, and a problem
    whose optimum lies on a bound (A = 1 on a curve still rising) then creeps towards it for
    hundreds of iterations. Zeroing the held parameters' Jacobian columns gives the others the
    step they would take with those parameters fixed.
    """
    step = _lm_step(resid, jac, damping)
    held = ((theta <= lower) & (step < 0)) | ((theta >= upper) & (step > 0))
    rows = held.any(axis=1)
    if rows.any():
        free = ~held[rows][:, None, :]
        step[rows] = _lm_step(resid[rows], jac[rows] * free, damping[rows])
    return step


def _finite(theta: FloatArray, resid: FloatArray, jac: FloatArray) -> BoolArray:
    return np.asarray(
        np.isfinite(theta).all(axis=1)
        & np.isfinite(resid).all(axis=1)
        & np.isfinite(jac).all(axis=(1, 2))
    )


def _lm_step(resid: FloatArray, jac: FloatArray, damping: FloatArray) -> FloatArray:
    """Solve (J^T J + lambda diag(J^T J)) delta = -J^T r for each problem (Marquardt scaling).

    Solved as (H' + lambda I) delta' = -g' with H' = D^-1 J^T J D^-1, D = sqrt(diag(J^T J)): H' has
    a unit diagonal, so lambda >= MIN_DAMPING keeps it invertible whatever the Jacobian's rank.
    A parameter with no effect at all (zero column) gets D = 1 and so no step.
    """
    grad = np.einsum("knp,kn->kp", jac, resid)
    hess = np.einsum("knp,knq->kpq", jac, jac)
    diag = np.einsum("kpp->kp", hess)
    d = np.sqrt(np.where(diag > 0, diag, 1.0))
    scaled = hess / (d[:, :, None] * d[:, None, :])
    eye = np.eye(grad.shape[1])
    damped = scaled + damping[:, None, None] * eye
    rhs = (grad / d)[..., None]
    # Entries can still overflow (a Jacobian near 1e154): such a problem takes no step, so its
    # damping grows until it stops, rather than feeding inf into LAPACK.
    bad = ~(np.isfinite(damped).all(axis=(1, 2)) & np.isfinite(rhs).all(axis=(1, 2)))
    damped[bad], rhs[bad] = eye, 0.0
    try:
        step = np.linalg.solve(damped, rhs)[..., 0]
    except np.linalg.LinAlgError:
        # Unreachable with the damping floor as far as we know; the pseudo-inverse keeps the
        # promise of never raising if rounding ever proves us wrong.
        step = np.einsum("kpq,kq->kp", np.linalg.pinv(damped, hermitian=True), rhs[..., 0])
    delta: FloatArray = -step / d
    return delta
