"""The fitter's least-squares problem: the law's residuals and Jacobian at a batch of parameter
vectors, each point weighted by 1 / its relative standard error. One class serves the grid's B
fits (`scalerl.fit.grid`), the refinement, the bootstrap and the profile (`scalerl.fit.fitter`),
all solved by `scalerl.fit.solver`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from scalerl.fit.law import gradient

IntArray = NDArray[np.intp]
FloatArray = NDArray[np.float64]
# The parameter vector everywhere: (A, B, ln C_mid, R0); Box = its (lower, upper) bounds.
Box = tuple[FloatArray, FloatArray]


@dataclass(frozen=True)
class Problem:
    """Least-squares residuals of the law, each scaled by its point's weight (1 / its standard
    error, relative): one or many targets (bootstrap) or base rows (grid)."""

    compute: FloatArray  # (n,)
    targets: FloatArray  # (1, n) shared, or (K, n): one row per problem
    base: FloatArray  # (1, 4) shared, or (K, 4): values of the parameters that are not free
    free: NDArray[np.bool_]  # (4,)
    weights: FloatArray  # (n,)

    def __call__(self, theta: FloatArray, rows: IntArray) -> tuple[FloatArray, FloatArray]:
        full = np.array(self.base if self.base.shape[0] == 1 else self.base[rows], dtype=float)
        full = np.broadcast_to(full, (theta.shape[0], 4)).copy()
        full[:, self.free] = theta
        A, B, log_c_mid, R0 = (full[:, i : i + 1] for i in range(4))
        parts = gradient(self.compute, A, B, log_c_mid, R0)
        targets = self.targets if self.targets.shape[0] == 1 else self.targets[rows]
        resid = (R0 + (A - R0) * parts[0] - targets) * self.weights
        jac = np.stack([p for p, f in zip(parts, self.free, strict=True) if f], axis=-1)
        return resid, jac * self.weights[:, None]
