"""Profile-likelihood interval for A: the asymptotes the points cannot rule out.

A bootstrap refits the law to resampled residuals from the best fit; when the curve has not yet
bent (C_mid near or beyond the last point) every replicate lands near that fit, and its interval
measures the noise of the points, not how little they say about the ceiling: a curve that keeps
rising fits a high A with a late C_mid as well as a lower A with an earlier one. The profile
asks the question directly. For every A of the grid the other parameters are refitted (B, ln C_mid
and, with `r0="fit"`, R0); an A is kept while its weighted sum of squares rises above the best
one's by at most

    F(level; 1, n - p) * s^2,

the likelihood-ratio threshold for one parameter with the noise variance s^2 estimated from the
residuals (F rather than chi-square: with a dozen points s^2 is itself uncertain), and s^2 never
below the variance the evaluations' own standard errors give (a smooth run's residuals can be
smaller than its noise by luck). The kept parameter sets are the curves the data allow; the
prediction band at any compute includes the range of their predictions.

When the kept A reach the grid's top (1.0) with that curve's C_mid beyond the fitted data, the
points bound the ceiling only from below: `A_at_least` (the smallest kept A) says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.stats import f as f_dist

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Profile:
    """The kept asymptotes and each one's best parameters (A, B, C_mid, R0), one row each, and
    the interval of A: where the profile crosses the threshold, between grid values."""

    kept: FloatArray  # (m, 4), C_mid not in log
    interval: tuple[float, float]
    at_least: float | None  # A bounded only from below: the smallest A the data allow


def threshold(sse: float, points: int, free: int, floor_variance: float, level: float) -> float:
    """The largest weighted SSE a kept A may have: the best `sse` plus F(level; 1, n - p) s^2."""
    dof = max(points - free, 1)
    variance = max(sse / dof, floor_variance)
    return sse + float(f_dist.ppf(level, 1, dof)) * variance


def select(
    params: FloatArray,
    sse: FloatArray,
    best: FloatArray,
    best_sse: float,
    limit: float,
    fit_range: tuple[float, float],
    top: float,
) -> Profile:
    """The profile from each grid A's refitted `params` (rows (A, B, ln C_mid, R0)) and `sse`.

    `best` (same layout) always belongs: the grid's A rows cannot be better than the continuous
    optimum. Open above when a kept A reaches `top` (the grid's last A) with its C_mid beyond
    the last fitted compute: the data allow a curve that has not yet bent towards any ceiling."""
    ok = np.isfinite(sse) & np.isfinite(params).all(axis=1) & (sse <= limit)
    rows = np.vstack([best[None, :], params[ok]])
    kept = rows.copy()
    kept[:, 2] = np.exp(rows[:, 2])
    kept = kept[np.argsort(kept[:, 0])]
    a_all = np.concatenate([[best[0]], params[:, 0]])
    sse_all, ok_all = np.concatenate([[best_sse], sse]), np.concatenate([[True], ok])
    rise = np.sqrt(np.maximum(sse_all - best_sse, 0.0))  # ~ linear in A near the optimum
    reach = float(np.sqrt(max(limit - best_sse, 0.0)))
    low = _crossing(a_all, rise, ok_all, reach, float(kept[0, 0]), -1)
    high = _crossing(a_all, rise, ok_all, reach, float(kept[-1, 0]), +1)
    # The highest kept curve still bending beyond the data: only then is the top a bound of the
    # grid and not of what the points say.
    open_above = bool(kept[-1, 0] >= top - 1e-9) and float(kept[-1, 2]) >= fit_range[1] * _BEYOND
    return Profile(kept=kept, interval=(low, high), at_least=low if open_above else None)


def _crossing(
    a: FloatArray, rise: FloatArray, ok: NDArray[np.bool_], reach: float, end: float, side: int
) -> float:
    """Where the profile's `rise` (sqrt of its SSE above the best: linear in A where the SSE is
    quadratic) reaches `reach` beyond the kept `end` on `side` (-1 below, +1 above), linearly
    between `end` and the next grid A, which was rejected; `end` itself when there is no such A
    (the grid ends there) or its SSE is not finite."""
    beyond = (a < end) if side < 0 else (a > end)
    if not beyond.any():
        return end
    k = int(np.argmax(a[beyond])) if side < 0 else int(np.argmin(a[beyond]))
    a_out, rise_out = float(a[beyond][k]), float(rise[beyond][k])
    inside = ok & (a == end)
    if not inside.any() or not np.isfinite(rise_out) or rise_out <= reach:
        return end
    rise_in = float(rise[inside][0])
    t = (reach - rise_in) / (rise_out - rise_in) if rise_out > rise_in else 0.0
    return end + float(np.clip(t, 0.0, 1.0)) * (a_out - end)


# "Beyond the data": the midpoint past 3/4 of the last fitted compute (in the law's own log scale
# the curve is then still in its first half at the data's end).
_BEYOND = 0.75
