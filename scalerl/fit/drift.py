"""How the run's own earlier extrapolations missed: a widening of the band beyond the data.

The band of a fit (bootstrap and profile) assumes the run follows the law. Real runs depart from
it in ways the points so far cannot show: published RL curves, fitted on their first half, were
underpredicted at the end by 0.025-0.08, and the demo's curve rises straight in compute. The only
evidence a run has of its own departures is how its earlier parts extrapolated to its later ones.
So the fitter also refits the points up to a few earlier origins o (half, 1/2.83 and a quarter of
the last fitted compute: each as far back as a prediction at twice the data reaches), asks each
what the fitted points at 1.5 o to 2 o read, and keeps the mean error of each origin, scaled to
a doubling of compute (error x ln 2 / ln(c / o)): a rolling-origin backtest inside the data.

`Drift` holds the largest underprediction (`up`) and overprediction (`down`) of those origins.
Beyond the fitted data, at compute C, the band's upper side widens by up x ln(C / h) / ln 2 and
its lower side by down x the same (h the last fitted compute), each in quadrature with the band's
own half-width and the evaluation's noise: a run whose earlier parts were underpredicted is told
its upper end reaches further, and one that followed the law gets little widening (its origin
errors are only noise). Nothing is widened inside the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
# Each origin's fit predicts the fitted points from RATIO_FROM x o to 2 o.
RATIO_FROM = 1.5
ORIGINS = (2.0, 2.0**1.5, 4.0)  # o = last fitted compute / each


@dataclass(frozen=True)
class Drift:
    """The largest scaled under- and overprediction of the run's earlier extrapolations (>= 0)."""

    up: float = 0.0
    down: float = 0.0
    origins: int = 0  # how many origins could be fitted

    def widening(self, compute: ArrayLike, last: float) -> tuple[FloatArray, FloatArray]:
        """(down, up) widening at `compute`: 0 up to `last`, growing with ln(compute / last)."""
        c = np.asarray(compute, dtype=float)
        with np.errstate(divide="ignore"):
            doublings = np.maximum(np.log(np.maximum(c, 0.0) / last), 0.0) / math.log(2.0)
        return self.down * doublings, self.up * doublings


def measure(
    compute: FloatArray,
    pass_rate: FloatArray,
    fitted: FloatArray,
    refit: Callable[[NDArray[np.bool_]], Callable[[FloatArray], FloatArray] | None],
) -> Drift:
    """The drift of a run's evaluations (`compute`, `pass_rate`, all of them, sorted), of which
    `fitted` marks those the fit used. `refit(mask)` fits the points `mask` keeps (with the
    fit's own options) and returns its curve, or None when they cannot be fitted."""
    last = float(compute[fitted][-1])
    errors = []
    for factor in ORIGINS:
        origin = last / factor
        targets = fitted & (compute >= RATIO_FROM * origin) & (compute <= 2.0 * origin)
        if not targets.any():
            continue
        curve = refit(compute <= origin)
        if curve is None:
            continue
        c = compute[targets]
        scale = math.log(2.0) / np.log(c / origin)
        errors.append(float(np.mean((pass_rate[targets] - curve(c)) * scale)))
    if not errors:
        return Drift()
    return Drift(up=max(0.0, max(errors)), down=max(0.0, -min(errors)), origins=len(errors))
