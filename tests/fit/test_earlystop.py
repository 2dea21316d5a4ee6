"""The early stop of a sweep's variants that cannot win: judged on what was measured as well as on
the fits, so that it stays sound when the good variants' fits are Misfit or TooEarly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from scalerl.fit.earlystop import losers
from scalerl.fit.law import sigmoid
from scalerl.fit.leaderboard import Evaluations, Standing
from scalerl.spec import ScaleRLRun, parse_sweep

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load((ROOT / "examples" / "sweep.yaml").read_text())
RUN: ScaleRLRun = parse_sweep(EXAMPLE).variant_runs()["pipelinerl-8"]
BUDGET = 0.08  # compute of the base's maxSteps (60) at COMPUTE_PER_STEP
COMPUTE_PER_STEP = BUDGET / 60
PROMPTS, K = 128, 8  # the example's held-out prompts and samples each


def history(
    curve: Callable[[np.ndarray], np.ndarray], evaluations: int, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """Evaluations every 5 steps from step 0, as `scalerl run` writes them: the mean over
    PROMPTS prompts of K samples each (binomial), and the SE of those per-prompt means."""
    steps = 5 * np.arange(evaluations)
    compute = steps * COMPUTE_PER_STEP
    rows = []
    for step, c, p in zip(steps, compute, curve(compute), strict=True):
        means = rng.binomial(K, float(p), size=PROMPTS) / K
        se = float(means.std(ddof=1) / np.sqrt(PROMPTS))
        rows.append(
            {"step": int(step), "compute": float(c), "pass_rate": means.mean(), "pass_rate_se": se}
        )
    return rows


def standing(name: str, rows: list[dict[str, Any]], fit: dict[str, Any] | None = None) -> Standing:
    ev = Evaluations.from_rows(rows, compute="compute", pass_rate="pass_rate", se="pass_rate_se")
    return Standing(name, RUN, "Running", ev, fit)


def good(compute: np.ndarray) -> np.ndarray:
    """The demo's good recipes: from 0.2 to about 0.9 within the budget."""
    return np.asarray(sigmoid(compute, 0.95, 1.5, 0.02, 0.2))


def flat(compute: np.ndarray) -> np.ndarray:
    """lr 1e-8: nothing is learned."""
    return np.full_like(compute, 0.2)


def misfit(A: float) -> dict[str, Any]:
    return {"A": A, "A_interval": [A - 0.02, A + 0.02], "points": 12, "confidence": "Misfit"}


def test_two_variants_of_one_curve_are_never_stopped() -> None:
    # 300 synthetic sweeps, judged after every evaluation as a sweep does: no false stop.
    rng = np.random.default_rng(7)
    for draw in range(300):
        a, b = history(good, 13, rng), history(good, 13, rng)
        for n in range(8, 14):
            fits = (None, misfit(0.8)) if draw % 2 else (None, None)
            judged = [standing("a", a[:n], fits[0]), standing("b", b[:n], fits[1])]
            assert losers(judged, min_points=8) == {}, (draw, n)


def test_a_flat_variant_beside_two_good_ones_is_stopped_on_measured_evidence() -> None:
    # The issue's sweep: both good recipes' fits are Misfit; the flat one's fit reads OK with a
    # zero-width interval. Every draw stops it, from its 8th trained evaluation (step 40).
    rng = np.random.default_rng(11)
    first = []
    for _ in range(100):
        rows = {name: history(curve, 13, rng) for name, curve in [("p", good), ("q", good)]}
        rows["lr"] = history(flat, 13, rng)
        for n in range(9, 14):
            stuck = {
                "A": 0.205, "A_interval": [0.205, 0.205], "points": n - 1, "confidence": "OK",
                "predictedAtBudget": 0.205, "predictedAtBudgetInterval": [0.2, 0.21],
            }  # fmt: skip
            judged = [
                standing("p", rows["p"][:n], misfit(0.79)),
                standing("q", rows["q"][:n], misfit(0.76)),
                standing("lr", rows["lr"][:n], stuck),
            ]
            stops = losers(judged, min_points=8)
            if stops:
                assert list(stops) == ["lr"]
                assert stops["lr"].evidence == "measured" and stops["lr"].yardstick in "pq"
                first.append(n)
                break
    assert first == [9] * 100


def test_the_reason_names_the_numbers_it_rests_on() -> None:
    rng = np.random.default_rng(3)
    lead, low = history(good, 12, rng), history(flat, 12, rng)
    (stop,) = losers([standing("lead", lead), standing("low", low)], min_points=8).values()
    recent = np.mean([r["pass_rate"] for r in low[-3:]])
    at = np.mean([r["pass_rate"] for r in lead[-3:]])  # same computes: the same steps
    assert stop.reason.startswith(f"measured {at - recent:.3f} below lead at the same compute")
    assert "no rise beyond noise" in stop.reason and stop.evidence == "measured"


def test_a_slightly_worse_variant_or_one_still_rising_is_not_stopped() -> None:
    rng = np.random.default_rng(5)
    for _ in range(50):
        lead = history(good, 13, rng)
        close = history(lambda c: good(c) - 0.02, 13, rng)  # what the paper counts as equal
        # slow: far below at the same compute (0.2 to 0.7 where the lead reaches 0.9), but
        # rising and with no trusted fit: no ceiling.
        slow = history(lambda c: np.asarray(sigmoid(c, 0.95, 2.0, 0.06, 0.2)), 13, rng)
        for n in range(8, 14):
            judged = [
                standing(name, rows[:n])
                for name, rows in [("lead", lead), ("close", close), ("slow", slow)]
            ]
            assert losers(judged, min_points=8) == {}


def test_no_stop_without_enough_points_or_without_standard_errors() -> None:
    rng = np.random.default_rng(1)
    lead, low = history(good, 13, rng), history(flat, 13, rng)
    assert losers([standing("lead", lead), standing("low", low[:8])], min_points=8) == {}
    assert losers([standing("lead", lead[:8]), standing("low", low)], min_points=8) == {}
    bare = [{k: v for k, v in r.items() if k != "pass_rate_se"} for r in low]
    assert losers([standing("lead", lead), standing("low", bare)], min_points=8) == {}
    assert list(losers([standing("lead", lead), standing("low", low)], min_points=8)) == ["low"]


def test_a_trusted_fit_decides_when_its_bound_binds() -> None:
    # The loser's measured evaluations still rise (no measured ceiling), but its checked fit
    # bounds A well below the leader's.
    rng = np.random.default_rng(2)
    lead = history(good, 10, rng)
    low = history(lambda c: np.asarray(sigmoid(c, 0.45, 3.0, 0.04, 0.2)), 10, rng)
    checked = {
        "A": 0.45, "A_interval": [0.43, 0.47], "points": 9, "confidence": "OK",
        "predictedAtBudget": 0.45, "predictedAtBudgetInterval": [0.43, 0.47],
    }  # fmt: skip
    (stop,) = losers([standing("lead", lead), standing("low", low, checked)], 8).values()
    assert stop.evidence == "fit" and "its forecast's upper bound at its budget, OK" in stop.reason
    # A's interval alone bounds nothing: the rule reads the forecast at the budget.
    law_only = {k: v for k, v in checked.items() if not k.startswith("predictedAtBudget")}
    assert losers([standing("lead", lead), standing("low", low, law_only)], 8) == {}
    # Misfit, the same fit bounds nothing: a rising variant without a trusted fit runs on.
    off = {**checked, "confidence": "Misfit"}
    assert losers([standing("lead", lead), standing("low", low, off)], 8) == {}
