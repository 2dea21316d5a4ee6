"""A batched Levenberg-Marquardt solver: many small, independent least-squares problems at once.

The fitter solves thousands of tiny problems — one B per (A, C_mid) grid cell, one full refit per
bootstrap replicate. A Python loop over scipy calls costs about a millisecond each; stacking the
problems and stepping them together in numpy costs a few milliseconds per iteration for all of
them. Box bounds are kept by projecting each trial point onto the box, which is enough for
problems started near their solution (our bootstrap) or in one dimension (our grid).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.intp]

# fun(theta (m, p), rows (m,)) -> residuals (m, n), jacobian (m, n, p) of problems `rows`.
Residuals = Callable[[FloatArray, IntArray], tuple[FloatArray, FloatArray]]


def solve_batched(
    fun: Residuals,
    theta0: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
    *,
    max_iter: int = 100,
    ftol: float = 1e-10,
    xtol: float = 1e-10,
) -> FloatArray:
    """Minimise sum(residuals**2) independently for every row of `theta0` (shape (K, p)).

    Converges a problem when a step lowers its SSE by less than `ftol` relative, or moves its
    parameters by less than `xtol` relative; gives up on it when the damping explodes (a flat or
    degenerate problem). Returns the best parameters found for each problem.
    """
    theta = np.clip(np.array(theta0, dtype=float), lower, upper)
    rows = np.arange(theta.shape[0])
    resid, jac = fun(theta, rows)
    sse = np.einsum("kn,kn->k", resid, resid)
    damping = np.full(theta.shape[0], 1e-3)
    active = rows.copy()
    for _ in range(max_iter):
        if active.size == 0:
            break
        step = _lm_step(resid[active], jac[active], damping[active])
        trial = np.clip(theta[active] + step, lower, upper)
        t_resid, t_jac = fun(trial, active)
        t_sse = np.einsum("kn,kn->k", t_resid, t_resid)
        better = t_sse < sse[active]
        moved = np.abs(trial - theta[active]).max(axis=1)
        scale = np.abs(theta[active]).max(axis=1) + xtol
        done = (better & (sse[active] - t_sse <= ftol * sse[active] + 1e-300)) | (
            moved <= xtol * scale
        )
        done |= damping[active] > 1e12
        keep = active[better]
        theta[keep], resid[keep], jac[keep], sse[keep] = (
            trial[better],
            t_resid[better],
            t_jac[better],
            t_sse[better],
        )
        damping[active] = np.where(better, damping[active] / 10.0, damping[active] * 10.0)
        active = active[~done]
    return theta


def _lm_step(resid: FloatArray, jac: FloatArray, damping: FloatArray) -> FloatArray:
    """Solve (J^T J + lambda diag(J^T J)) delta = -J^T r for each problem (Marquardt scaling)."""
    grad = np.einsum("knp,kn->kp", jac, resid)
    hess = np.einsum("knp,knq->kpq", jac, jac)
    diag = np.einsum("kpp->kp", hess)
    # A floor on the diagonal keeps the system solvable when a parameter has no effect (flat curve).
    damped = hess + np.einsum(
        "kp,pq->kpq", damping[:, None] * np.maximum(diag, 1e-12), np.eye(grad.shape[1])
    )
    return -np.linalg.solve(damped, grad[..., None])[..., 0]
