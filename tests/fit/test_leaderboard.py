"""Ranking a sweep's variants the paper's way, and the early stop of the ones that cannot win."""

from __future__ import annotations

import numpy as np

from scalerl.fit import fit_curve, sample_curve
from scalerl.fit.leaderboard import Entry, losers, rank


def fit(A: float, lo: float, hi: float, points: int = 10) -> dict[str, object]:
    return {"A": A, "A_interval": [lo, hi], "points": points}


def test_a_variant_whose_a_interval_lies_below_the_best_one_s_is_stopped() -> None:
    fits = {
        "best": fit(0.80, 0.76, 0.84),
        "close": fit(0.74, 0.70, 0.77),  # overlaps the best's interval: it may still win
        "loser": fit(0.60, 0.55, 0.75),
        "early": fit(0.20, 0.10, 0.30, points=3),  # too few points to judge
    }
    assert losers(fits, min_points=8) == {
        "loser": "A interval [0.550, 0.750] from 10 points lies below best's [0.760, 0.840]"
    }


def test_only_judged_variants_can_be_the_best() -> None:
    # The highest A rests on 3 points: it is no yardstick yet, so nobody is stopped.
    fits = {"lucky": fit(0.95, 0.94, 0.96, points=3), "other": fit(0.5, 0.45, 0.55)}
    assert losers(fits, min_points=8) == {}
    assert losers({"alone": fit(0.5, 0.4, 0.6)}, min_points=8) == {}


def test_a_fit_off_the_law_neither_judges_nor_is_judged() -> None:
    # A Misfit fit's intervals assume a law its run is not following (scalerl.fit.backtest):
    # it cannot stop another variant, nor be stopped by one.
    misfit = {**fit(0.95, 0.94, 0.96), "confidence": "Misfit"}
    assert losers({"off": misfit, "other": fit(0.5, 0.45, 0.55)}, min_points=8) == {}
    low = {**fit(0.30, 0.25, 0.35), "confidence": "Misfit"}
    ok = {**fit(0.80, 0.76, 0.84), "confidence": "OK"}
    assert losers({"off": low, "best": ok, "other": fit(0.5, 0.45, 0.55)}, min_points=8) == {
        "other": "A interval [0.450, 0.550] from 10 points lies below best's [0.760, 0.840]"
    }


def entry(name: str, A: float, B: float, seed: int) -> Entry:
    compute = np.geomspace(0.05, 40.0, 30)
    rates = sample_curve(compute, A, B, 4.0, 0.1, noise=0.002, seed=seed)
    return Entry(name, fit_curve(compute, rates, min_compute=0.0), compute, rates)


def test_variants_rank_by_a_then_by_b_at_a_shared_a() -> None:
    slow = entry("slow", 0.80, 1.0, seed=1)
    fast = entry("fast", 0.80, 2.5, seed=2)  # the same ceiling, reached with less compute
    low = entry("low", 0.60, 3.0, seed=3)  # the most efficient, with a lower ceiling
    unfitted = Entry("unfitted", None, np.array([0.0]), np.array([0.1]))
    ranked = rank([low, unfitted, slow, fast])
    assert [e.name for e in ranked] == ["fast", "slow", "low", "unfitted"]
