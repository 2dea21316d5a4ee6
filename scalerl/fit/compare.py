"""Which of two runs scales better — the paper's comparison rule.

Three independent runs of one recipe differed in A by at most +-0.015, so the paper treats A values
within 0.02 as equal. Then both curves are refitted with A fixed at the mean of the two, and the
higher B (reaching the shared ceiling with less compute) is at least as good. Otherwise the higher
A is better, whatever B says.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Literal

from numpy.typing import ArrayLike

from scalerl.errors import FitError, InputError
from scalerl.fit.fitter import fit_curve
from scalerl.fit.result import FitResult

A_MARGIN = 0.02
# |A_a - A_b| is computed in floating point: 0.61 - 0.59 = 0.020000000000000018 must count as 0.02.
ROUNDING = 1e-9


@dataclass(frozen=True)
class Comparison:
    """The verdict and the numbers it rests on. `winner` is "a", "b" or "tie" (equal B)."""

    winner: Literal["a", "b", "tie"]
    rule: Literal["asymptote", "efficiency"]
    A_a: float
    A_b: float
    margin: float
    A_shared: float | None = None  # efficiency rule: the mean A both were refitted at
    B_a: float | None = None  # efficiency rule: B of each run refitted at A_shared
    B_b: float | None = None

    def verdict(self, name_a: str = "a", name_b: str = "b") -> str:
        """One sentence a person reads."""
        names = {"a": name_a, "b": name_b}
        if self.rule == "asymptote":
            return (
                f"{names[self.winner]} is better: higher asymptote A "
                f"({self.A_a:.3f} vs {self.A_b:.3f}, differ by {self._gap()} > {self.margin:g})"
            )
        detail = (
            f"A within {self.margin:g} ({self.A_a:.3f} vs {self.A_b:.3f}); refitted at "
            f"A = {self.A_shared:.4f}: B {self.B_a:.3f} vs {self.B_b:.3f}"
        )
        if self.winner == "tie":
            return f"tie: {detail}"
        return (
            f"{names[self.winner]} is at least as good (higher B, more compute-efficient): {detail}"
        )

    def _gap(self) -> str:
        """|A_a - A_b| with the digits that show it beyond the margin (0.0204, not 0.020)."""
        gap = abs(self.A_a - self.A_b)
        for digits in range(3, 10):
            text = f"{gap:.{digits}f}"
            if float(text) > self.margin:
                return text
        return f"{gap:.10g}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(
    fit_a: FitResult,
    fit_b: FitResult,
    data_a: tuple[ArrayLike, ArrayLike],
    data_b: tuple[ArrayLike, ArrayLike],
    *,
    margin: float = A_MARGIN,
) -> Comparison:
    """Apply the paper's rule to two fits; `data_*` = (compute, pass_rate) each fit was made from.

    The refits at the shared A keep each fit's own min_compute and R0. Raises InputError for a
    bad margin, and the fitter's errors when a refit fails.
    """
    if not (isinstance(margin, numbers.Real) and math.isfinite(margin) and margin >= 0):
        raise InputError(f"margin must be a finite number >= 0, got {margin!r}")
    if abs(fit_a.A - fit_b.A) > margin + ROUNDING:
        winner: Literal["a", "b", "tie"] = "a" if fit_a.A > fit_b.A else "b"
        return Comparison(winner, "asymptote", fit_a.A, fit_b.A, margin)
    shared = (fit_a.A + fit_b.A) / 2.0
    b_a = refit_b("a", fit_a, data_a, shared)
    b_b = refit_b("b", fit_b, data_b, shared)
    winner = "tie" if b_a == b_b else ("a" if b_a > b_b else "b")
    return Comparison(winner, "efficiency", fit_a.A, fit_b.A, margin, shared, b_a, b_b)


def refit_b(name: str, fit: FitResult, data: tuple[ArrayLike, ArrayLike], A: float) -> float:
    """B of `fit`'s points (`data`: compute, pass rate) refitted at the shared asymptote `A`,
    with the fit's own min_compute, R0 and weights; a failed refit is a FitError naming `name`."""
    r0: Literal["fit"] | float = "fit" if fit.r0_mode == "fit" else fit.R0
    compute, pass_rate = data
    try:
        refit = fit_curve(
            compute,
            pass_rate,
            min_compute=fit.min_compute,
            r0=r0,
            bootstrap=0,
            a_fixed=A,
            sigma=fit.sigma,
        )
    except FitError as err:  # e.g. the shared A is at or below this run's R0
        raise FitError(f"run {name}: the refit at the shared A = {A:.4f} failed: {err}") from None
    return refit.B
