"""The sigmoidal scaling law of ScaleRL, its fitter, the comparison rule for runs, and plots.

Typical use::

    from scalerl.fit import fit_curve, load_curve
    curve = load_curve("examples/curve.csv")
    result = fit_curve(curve.compute, curve.pass_rate)
    result.A, result.A_interval, result.predict(100_000)
"""

from scalerl.fit.compare import A_MARGIN, Comparison, compare
from scalerl.fit.fitter import fit_curve
from scalerl.fit.grid import PAPER_A_GRID, PAPER_C_MID_RANGE
from scalerl.fit.law import compute_to_reach, sample_curve, sigmoid
from scalerl.fit.plot import plot_fit
from scalerl.fit.points import Curve, check_points, load_curve
from scalerl.fit.result import FitResult

__all__ = [
    "A_MARGIN",
    "PAPER_A_GRID",
    "PAPER_C_MID_RANGE",
    "Comparison",
    "Curve",
    "FitResult",
    "check_points",
    "compare",
    "compute_to_reach",
    "fit_curve",
    "load_curve",
    "plot_fit",
    "sample_curve",
    "sigmoid",
]
