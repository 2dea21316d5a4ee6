"""The trainer's step profile: phases that nest never count twice."""

from __future__ import annotations

import math
import time

from scalerl.trainer.profile import PHASES, Phases


def test_a_phase_inside_another_counts_once_and_the_phases_add_up_to_the_wall() -> None:
    phases = Phases()
    outside = time.perf_counter()
    with phases.timing("start"):
        time.sleep(0.02)
        with phases.timing("broadcast"):  # e.g. a phase timed inside another's
            time.sleep(0.03)
        time.sleep(0.01)
        phases.add("forward_backward", 0.01)  # measured by the step itself, inside "start"
    outside = time.perf_counter() - outside
    totals = phases.totals()

    start, broadcast = totals["start"], totals["broadcast"]
    assert broadcast >= 0.03 and start >= 0.02
    # Counted twice, the broadcast (and the step) would make these exceed the time that passed.
    assert start + broadcast + 0.01 <= outside
    parts = [totals[p] for p in (*PHASES, "other")]
    assert min(parts) >= 0
    assert math.isclose(sum(parts), totals["wall"], rel_tol=1e-9)


def test_a_resumed_profile_goes_on_from_the_totals_its_checkpoint_saved() -> None:
    first = Phases()
    with first.timing("wait_rollouts"):
        time.sleep(0.02)
    saved = first.totals()

    resumed = Phases(saved)
    with resumed.timing("wait_rollouts"):
        time.sleep(0.01)
    totals = resumed.totals()

    assert totals["wait_rollouts"] >= saved["wait_rollouts"] + 0.01
    assert totals["wall"] >= saved["wall"] + 0.01
    parts = [totals[p] for p in (*PHASES, "other")]
    assert math.isclose(sum(parts), totals["wall"], rel_tol=1e-9)


def test_totals_read_inside_open_phases_give_them_their_time_so_far() -> None:
    # An evaluation writes its history row (these totals) before its own phase closes; the
    # compute clock stopped as it began, so the row must count that time as evaluating too.
    phases = Phases()
    with phases.timing("evaluate"):
        time.sleep(0.03)
        with phases.timing("broadcast"):
            time.sleep(0.02)
            inside = phases.totals()
    assert inside["evaluate"] >= 0.03 and inside["broadcast"] >= 0.02
    assert inside["other"] < 0.01  # not the open phases' time
    parts = [inside[p] for p in (*PHASES, "other")]
    assert math.isclose(sum(parts), inside["wall"], rel_tol=1e-9)
    # Once closed, the phases hold at least what was read inside them: nothing counted twice.
    after = phases.totals()
    assert after["evaluate"] >= inside["evaluate"] and after["broadcast"] >= inside["broadcast"]
    assert math.isclose(sum(after[p] for p in (*PHASES, "other")), after["wall"], rel_tol=1e-9)
