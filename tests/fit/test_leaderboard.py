"""Ranking a sweep's variants: one total order keeping the paper's rule (A first; A within 0.02
ranked by B refitted at their shared A), whatever order the variants are listed in."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.fit import compare, fit_curve, sample_curve
from scalerl.fit.leaderboard import ROW_KEYS, Entry, Evaluations, Standing, board, rank
from scalerl.spec import parse_sweep

ROOT = Path(__file__).resolve().parents[2]
RUN = parse_sweep(yaml.safe_load((ROOT / "examples" / "sweep.yaml").read_text())).variant_runs()[
    "pipelinerl-8"
]


def clean(name: str, A: float, B: float, points: int = 41) -> Entry:
    c = np.linspace(0, 100, points)
    y = sample_curve(c, A, B, 20.0, 0.2)
    return Entry(name, fit_curve(c, y, min_compute=0, bootstrap=0), c, y)


def test_the_audit_s_cycle_ranks_one_way_for_every_listing() -> None:
    # Pairwise, a beats b (B), b beats c (B), c beats a (A): a sort by that rule gave abc, bca or
    # cab by listing order. Grouped: c (0.630) and b (0.615) are one group, refitted at their
    # mean A, where b's B is higher; a (0.600) lies more than 0.02 below c and follows.
    entries = [clean("a", 0.600, 3.0), clean("b", 0.615, 2.0), clean("c", 0.630, 1.2)]
    orders = {"".join(e.name for e in rank(list(p))) for p in itertools.permutations(entries)}
    assert orders == {"bca"}
    b, c = entries[1], entries[2]
    assert b.fit is not None and c.fit is not None
    by_hand = compare(b.fit, c.fit, (b.compute, b.pass_rate), (c.compute, c.pass_rate))
    assert (by_hand.rule, by_hand.winner) == ("efficiency", "a")  # b ahead of c at the shared A


@settings(max_examples=10, deadline=None, database=None)
@given(
    st.lists(
        st.tuples(st.floats(0.5, 0.7), st.floats(0.8, 3.0)), min_size=2, max_size=4, unique=True
    ),
    st.randoms(use_true_random=False),
)
def test_any_set_of_variants_ranks_one_way_and_groups_by_a(params: list, shuffle: object) -> None:
    entries = [clean(f"v{i}", A, B, points=15) for i, (A, B) in enumerate(params)]
    ranked = [e.name for e in rank(entries)]
    for _ in range(2):
        listed = entries[:]
        shuffle.shuffle(listed)  # type: ignore[attr-defined]
        assert [e.name for e in rank(listed)] == ranked
    # Whoever ranks ahead has the higher A, unless both lie within 0.02 of the A of the best
    # variant not ranked ahead of them both (one group).
    fits = {e.name: e.fit.A for e in entries if e.fit is not None}
    for i, j in itertools.combinations(range(len(ranked)), 2):
        top = max(fits[n] for n in ranked[min(i, j) :])
        same_group = fits[ranked[j]] >= top - 0.02 - 1e-9 and fits[ranked[i]] >= top - 0.02 - 1e-9
        assert same_group or fits[ranked[i]] > fits[ranked[j]]


def test_variants_rank_by_a_then_by_b_at_a_shared_a() -> None:
    def noisy(name: str, A: float, B: float, seed: int) -> Entry:
        compute = np.geomspace(0.05, 40.0, 30)
        rates = sample_curve(compute, A, B, 4.0, 0.1, noise=0.002, seed=seed)
        return Entry(name, fit_curve(compute, rates, min_compute=0.0), compute, rates)

    slow = noisy("slow", 0.80, 1.0, seed=1)
    fast = noisy("fast", 0.80, 2.5, seed=2)  # the same ceiling, reached with less compute
    low = noisy("low", 0.60, 3.0, seed=3)  # the most efficient, with a lower ceiling
    unfitted = Entry("unfitted", None, np.array([0.0]), np.array([0.1]))
    ranked = rank([low, unfitted, slow, fast])
    assert [e.name for e in ranked] == ["fast", "slow", "low", "unfitted"]


def rows(steps: np.ndarray, rates: np.ndarray, se: float) -> Evaluations:
    history = [
        {"step": int(s), "compute": s * 0.001, "pass_rate": float(r), "pass_rate_se": se}
        for s, r in zip(steps, rates, strict=True)
    ]
    return Evaluations.from_rows(
        history, compute="compute", pass_rate="pass_rate", se="pass_rate_se"
    )


def test_a_row_shows_the_weighted_fit_it_was_ranked_by_and_the_compute_its_stop_saved() -> None:
    steps = np.arange(0, 45, 5)
    rates = sample_curve(steps * 0.001, 0.8, 1.5, 0.02, 0.2, noise=0.01, seed=4)
    stopped = Standing(
        "lr", RUN, "Stopped", rows(steps, rates, 0.01), {"confidence": "OK"}, "why", "measured"
    )
    (row,) = board([stopped])
    assert tuple(row) == ROW_KEYS
    fit = fit_curve(steps * 0.001, rates, min_compute=0.0, sigma=np.full(steps.size, 0.01))
    assert (row["A"], row["B"], row["points"]) == (fit.A, fit.B, fit.points)
    assert row["compute"] == 0.04 and row["computeUnit"] == "process-hours"
    # Stopped after its evaluation at step 40 (0.04): its budget's 60 steps would have spent
    # 0.06 at that pace, well under maxComputeHours 0.5.
    assert row["computeSaved"] == 0.06 - 0.04
    assert (row["stopReason"], row["stopEvidence"], row["confidence"]) == ("why", "measured", "OK")


def unbent(name: str, C_mid: float, end: float, seed: int) -> Entry:
    """A variant whose curve has not bent by its last evaluation: its fit bounds A from below
    only, and the bound grows with how far it ran."""
    compute = np.linspace(0, end, 25)
    rates = sample_curve(compute, 0.9, 1.0, C_mid, 0.2, noise=0.004, seed=seed)
    return Entry(name, fit_curve(compute, rates, min_compute=0), compute, rates)


def test_variants_bounded_only_from_below_rank_by_what_they_read_at_equal_compute() -> None:
    # `long` ran four times as far: its bound is the highest, though at compute 100 (where all
    # three have been) it reads lowest. `short` and `twin` read within 0.02 there: tied.
    long, short = unbent("long", 2000, 400, 1), unbent("short", 900, 100, 2)
    twin = unbent("twin", 950, 100, 3)
    compute = np.linspace(0, 400, 41)
    rates = sample_curve(compute, 0.5, 2.0, 40.0, 0.2, noise=0.004, seed=4)
    closed = Entry("closed", fit_curve(compute, rates, min_compute=0), compute, rates)
    entries = [long, short, twin, closed]
    bounds = {e.name: e.fit.A_at_least for e in entries if e.fit is not None}
    assert bounds["closed"] is None and bounds["long"] > bounds["short"] > bounds["twin"]
    # Independently: each open fit's curve at the least last compute of the three.
    reads = {e.name: float(e.fit.predict(100.0)) for e in (long, short, twin) if e.fit}
    assert abs(reads["short"] - reads["twin"]) <= 0.02 < reads["twin"] - reads["long"]
    for listed in itertools.permutations(entries):
        # The closed variant's A (0.50) lies above every bound: it leads.
        assert [e.name for e in rank(list(listed))] == ["closed", "short", "twin", "long"]
    standings = [
        Standing(e.name, RUN, "Running", Evaluations(np.arange(25), e.compute, e.pass_rate, None))
        for e in entries
    ]
    tied = {row["name"]: row["tiedWith"] for row in board(standings, entries)}
    assert tied == {"closed": [], "short": ["twin"], "twin": ["short"], "long": []}


def test_an_open_variant_whose_bound_reaches_a_closed_one_s_a_goes_ahead_of_it() -> None:
    compute = np.linspace(0, 400, 41)
    rates = sample_curve(compute, 0.35, 2.0, 40.0, 0.2, noise=0.004, seed=4)
    closed = Entry("closed", fit_curve(compute, rates, min_compute=0), compute, rates)
    long = unbent("long", 2000, 400, 1)
    assert long.fit is not None and closed.fit is not None
    assert long.fit.A_at_least is not None and long.fit.A_at_least > closed.fit.A
    assert [e.name for e in rank([closed, long])] == ["long", "closed"]
