"""A picture of a fit: the points, the fitted law, its extrapolation with a bootstrap band.

Compute is on a log axis, as the paper plots its curves: the law is a logistic function of
log C, so the rise is a symmetric S around C_mid, and runs measured in any unit look alike.

matplotlib is imported inside `figure_of_fit`, so importing scalerl.fit stays light, and we draw on
an Agg canvas directly (no pyplot): no global backend is switched, nothing needs a display.
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
    from matplotlib.figure import Figure

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
    """Write a PNG of the fit to `path` (see `figure_of_fit`) and return the path."""
    return _save(figure_of_fit(result, compute, pass_rate, predict_to, xlabel=xlabel), path)


def _save(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    try:
        fig.savefig(out, format="png", dpi=110)
    except OSError as err:
        raise InputError(f"{out}: cannot write the plot ({err.strerror or err})") from None
    return out


def figure_of_fit(
    result: FitResult,
    compute: ArrayLike,
    pass_rate: ArrayLike,
    predict_to: float | None = None,
    *,
    xlabel: str = "compute",
) -> Figure:
    """The plot of a fit, compute on a log axis.

    Points used by the fit are filled circles, points below min_compute hollow; the law is solid
    over the data and dashed beyond the last point, up to `predict_to`. Evaluations at compute 0
    (the base model, before any RL) have no place on a log axis: R0 is drawn as a horizontal
    reference line instead, which is also what the law tends to on the left.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    c = np.asarray(compute, dtype=float)
    y = np.asarray(pass_rate, dtype=float)
    left, last = _compute_span(result, c)
    horizon = max(last, float(predict_to) if predict_to is not None else DEFAULT_HORIZON * last)
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    _draw_points(ax, c, y, result.min_compute)
    _draw_law(ax, result, left, last, horizon)
    ax.set_xlabel(f"{xlabel} (log scale)")
    ax.set_ylabel("pass rate")
    ax.set_xlim(left, horizon * 1.1)
    ax.set_title(f"A = {result.A:.3f}, B = {result.B:.2f}, C_mid = {result.C_mid:.4g}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", fontsize="small")
    return fig


def plot_curves(
    curves: list[tuple[str, FitResult | None, ArrayLike, ArrayLike]],
    path: str | Path,
    *,
    xlabel: str = "compute",
) -> Path:
    """One PNG of several runs (a sweep's variants): each one's points, and where it has a fit,
    its law and bootstrap band, in one colour per run, compute on a log axis. `curves` holds
    (name, fit or None, compute, pass_rate) per run."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 5.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    for i, (name, result, compute, pass_rate) in enumerate(curves):
        c, y = np.asarray(compute, dtype=float), np.asarray(pass_rate, dtype=float)
        color = f"C{i % 10}"
        on_axis = c > 0
        label = name if result is None else f"{name}: A = {result.A:.3f}"
        ax.plot(c[on_axis], y[on_axis], "o", color=color, markersize=3, label=label)
        if result is None or not on_axis.any():
            continue
        span = np.geomspace(float(c[on_axis].min()), float(c[on_axis].max()), 200)
        ax.plot(span, result.predict(span), "-", color=color)
        band = result.predict_interval(span)
        if band is not None:
            ax.fill_between(span, band[0], band[1], color=color, alpha=0.15, linewidth=0)
    ax.set_xlabel(f"{xlabel} (log scale)")
    ax.set_ylabel("held-out pass rate")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", fontsize="small")
    return _save(fig, path)


def _compute_span(result: FitResult, c: np.ndarray) -> tuple[float, float]:
    """Left edge of the log axis (half the smallest positive compute) and the last compute."""
    positive = c[c > 0]
    if positive.size == 0:  # nothing to place on the axis: show the law's rise around C_mid
        return result.C_mid / 100.0, result.C_mid * 10.0
    return float(positive.min()) / 2.0, float(positive.max())


def _draw_points(ax: Axes, c: np.ndarray, y: np.ndarray, min_compute: float) -> None:
    on_axis = c > 0  # compute 0 cannot sit on a log axis; R0 stands for it (see _draw_law)
    c, y = c[on_axis], y[on_axis]
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


def _draw_law(ax: Axes, result: FitResult, left: float, last: float, horizon: float) -> None:
    seen = np.geomspace(left, last, 300)
    ahead = np.geomspace(last, horizon, 200)
    ax.plot(seen, result.predict(seen), "-", color="C1", label="fitted law")
    if horizon > last:
        ax.plot(
            ahead, result.forecast(ahead), "--", color="C1", label="forecast (law + run's drift)"
        )
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
    ax.axhline(result.R0, color="0.5", linestyle="-.", label=f"R0 = {result.R0:.3f} (compute 0)")


def _asymptote_label(result: FitResult) -> str:
    if result.A_interval is None:
        return f"asymptote A = {result.A:.3f}"
    lo, hi = result.A_interval
    return f"asymptote A = {result.A:.3f} [{lo:.3f}, {hi:.3f}]"
