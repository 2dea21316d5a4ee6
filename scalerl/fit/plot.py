"""A picture of a fit: the points, the fitted law, its extrapolation with a bootstrap band.

matplotlib is imported inside `plot_fit`, so importing scalerl.fit stays light, and we draw on an
Agg canvas directly (no pyplot): no global backend is switched, nothing needs a display.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from scalerl.errors import InputError
from scalerl.fit.result import FitResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes

# Without an explicit horizon we extrapolate to twice the last point: far enough to see the bend.
DEFAULT_HORIZON = 2.0


def plot_fit(
    result: FitResult,
    compute: ArrayLike,
    pass_rate: ArrayLike,
    path: str | Path,
    predict_to: float | None = None,
    *,
    xlabel: str = "compute",
) -> Path:
    """Write a PNG of the fit to `path` and return the path.

    Points used by the fit are filled circles, points below min_compute hollow; the law is solid
    over the data and dashed beyond the last point, up to `predict_to`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    c = np.asarray(compute, dtype=float)
    y = np.asarray(pass_rate, dtype=float)
    last = float(c.max())
    horizon = max(last, float(predict_to) if predict_to is not None else DEFAULT_HORIZON * last)
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    _draw_points(ax, c, y, result.min_compute)
    _draw_law(ax, result, last, horizon)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("pass rate")
    ax.set_xlim(0.0, horizon * 1.02)
    ax.set_title(f"A = {result.A:.3f}, B = {result.B:.2f}, C_mid = {result.C_mid:.4g}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    out = Path(path)
    try:
        fig.savefig(out, format="png", dpi=110)
    except OSError as err:
        raise InputError(f"{out}: cannot write the plot ({err.strerror or err})") from None
    return out


def _draw_points(ax: Axes, c: np.ndarray, y: np.ndarray, min_compute: float) -> None:
    used = c >= min_compute
    ax.plot(c[used], y[used], "o", color="C0", markersize=4, label="evaluations (fitted)")
    if (~used).any():
        ax.plot(
            c[~used],
            y[~used],
            "o",
            markerfacecolor="none",
            color="C0",
            markersize=5,
            label=f"evaluations below min_compute {min_compute:.4g} (excluded)",
        )


def _draw_law(ax: Axes, result: FitResult, last: float, horizon: float) -> None:
    seen = np.linspace(0.0, last, 300)
    ahead = np.linspace(last, horizon, 200)
    ax.plot(seen, result.predict(seen), "-", color="C1", label="fitted law")
    if horizon > last:
        ax.plot(ahead, result.predict(ahead), "--", color="C1", label="extrapolation")
    band = result.predict_interval(np.concatenate([seen, ahead]))
    if band is not None:
        level = round(100 * result.level)
        ax.fill_between(
            np.concatenate([seen, ahead]),
            band[0],
            band[1],
            color="C1",
            alpha=0.2,
            linewidth=0,
            label=f"{level}% bootstrap band",
        )
    ax.axhline(result.A, color="C2", linestyle=":", label=_asymptote_label(result))


def _asymptote_label(result: FitResult) -> str:
    if result.A_interval is None:
        return f"asymptote A = {result.A:.3f}"
    lo, hi = result.A_interval
    return f"asymptote A = {result.A:.3f} [{lo:.3f}, {hi:.3f}]"
