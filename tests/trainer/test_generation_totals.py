"""The history's `generation` totals: the generators' counters summed over the run, a replaced
generator process's included, so the counters keep agreeing with each other (a rollout's turns
are at least one plus its tool calls)."""

from __future__ import annotations

from pathlib import Path

from test_signal import trainer

from scalerl.rollout.records import GeneratorStats


def stats(generator: int, samples: int, turns: int = 0, tool_calls: int = 0) -> GeneratorStats:
    return GeneratorStats(
        generator=generator,
        version=3,
        generated_tokens=10 * samples,
        generated_sequences=samples,
        truncated_sequences=0,
        idle_seconds=1.0,
        weight_sync_seconds=0.5,
        uptime_seconds=60.0,
        score_seconds=0.25,
        send_wait_seconds=0.0,
        agent_turns=turns,
        tool_calls=tool_calls,
    )


def test_a_replaced_generator_s_counters_all_stay_in_the_totals(tmp_path: Path) -> None:
    t = trainer(tmp_path, no_signal_steps=3)
    t.generator_stats = {0: stats(0, 100, 180, 80), 1: stats(1, 60, 110, 50)}
    t.retire(1)  # generator 1's process died; its replacement reports from zero
    t.generator_stats[1] = stats(1, 8, 15, 7)
    totals = t.generation_totals()
    assert totals["generated_samples"] == 100 + 60 + 8
    assert totals["generated_tokens"] == 10 * (100 + 60 + 8)
    assert totals["agent_turns"] == 180 + 110 + 15
    assert totals["tool_calls"] == 80 + 50 + 7
    assert totals["tool_calls"] <= totals["agent_turns"] - totals["generated_samples"]
    assert totals["generation_seconds"] == 60.0  # per generator: the processes running now


def test_a_run_without_an_environment_has_no_agent_totals(tmp_path: Path) -> None:
    t = trainer(tmp_path, no_signal_steps=3)
    t.generator_stats = {0: stats(0, 100), 1: stats(1, 60)}
    t.retire(1)
    assert "agent_turns" not in t.generation_totals()
    assert t.generation_totals()["generated_samples"] == 160
