"""Variants of one recipe, ranked the paper's way, and the early stop of the ones that cannot win.

The rule (paper, and `scalerl.fit.compare`): a higher asymptote A wins; A values within 0.02 are
equal, and then the variant whose curve, refitted at their shared A, has the higher B (reaches
it with less compute) is ahead. A variant is stopped early once its whole A interval lies below
the best variant's A interval: its ceiling is lower than the best's with the confidence of the
intervals, and what it would spend to its budget is saved. Only fits that can be trusted are
judged: enough points (a 5-point fit of the demo put A in [0.433, 0.438] where the run went on
to 1.0), and not `Misfit` (the run is off the law its intervals assume: `scalerl.fit.backtest`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalerl.errors import FitError
from scalerl.fit.compare import compare
from scalerl.fit.outlook import MISFIT
from scalerl.fit.result import FitResult


@dataclass(frozen=True)
class Entry:
    """One variant: its fit (None while it has none) and the points the fit was made from."""

    name: str
    fit: FitResult | None
    compute: np.ndarray
    pass_rate: np.ndarray


def losers(fits: Mapping[str, Mapping[str, Any]], min_points: int) -> dict[str, str]:
    """The variants to stop, with the reason: those whose A interval lies wholly below the best
    variant's. `fits` maps a variant to its latest fit (A, A_interval, points, confidence, as
    fit.json and status.prediction have them); only fits of at least `min_points` points whose
    confidence is not Misfit are judged, and only they can be the best."""
    judged = {
        name: fit
        for name, fit in fits.items()
        if fit.get("A_interval")
        and int(fit.get("points", 0)) >= min_points
        and fit.get("confidence") != MISFIT
    }
    if len(judged) < 2:
        return {}
    best = max(judged, key=lambda name: float(judged[name]["A"]))
    best_lo, best_hi = judged[best]["A_interval"]
    out = {}
    for name, fit in judged.items():
        lo, hi = fit["A_interval"]
        if name != best and hi < best_lo:
            out[name] = (
                f"A interval [{lo:.3f}, {hi:.3f}] from {fit['points']} points lies below "
                f"{best}'s [{best_lo:.3f}, {best_hi:.3f}]"
            )
    return out


def rank(entries: list[Entry]) -> list[Entry]:
    """Best first by the paper's rule; variants without a fit last, in their given order."""
    fitted = [e for e in entries if e.fit is not None]
    return sorted(fitted, key=functools.cmp_to_key(_versus)) + [e for e in entries if e.fit is None]


def _versus(a: Entry, b: Entry) -> int:
    """-1 when `a` ranks ahead of `b`. A refit at the shared A that fails leaves A to decide."""
    assert a.fit is not None and b.fit is not None
    try:
        winner = compare(a.fit, b.fit, (a.compute, a.pass_rate), (b.compute, b.pass_rate)).winner
    except FitError:
        winner = "a" if a.fit.A >= b.fit.A else "b"
    return {"a": -1, "b": 1, "tie": 0}[winner]
