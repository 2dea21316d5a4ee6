"""The generator's scorer: code runs in a pool of threads sized to the CPUs while the event loop
(and with it the engine) keeps going; sandbox failures drop the sample and are counted."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from scalerl.generator import scoring
from scalerl.generator.scoring import Scorer, pool_size
from scalerl.metrics import GeneratorMetrics
from scalerl.sandbox import isolation
from scalerl.spec import CodeSpec

ADD = json.dumps({"inputs": ["1 2\n", "3 4\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]})
RIGHT = "a, b = map(int, input().split())\nprint(a + b)\n"
SLOW = "import time\ntime.sleep(60)\n" + RIGHT  # far past any test timeout


def _value(metrics: GeneratorMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name, {"namespace": "ns", "run": "r"})
    return 0.0 if value is None else value


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [
        (None, None),  # no cgroup file: the affinity alone
        ("max 100000\n", None),  # no limit
        ("150000 100000\n", 2),  # 1.5 CPUs: two programs at once
        ("50000 100000\n", 1),
        ("800000 100000\n", None),  # more than the affinity allows: the affinity
    ],
)
def test_the_pool_has_one_worker_per_usable_cpu_unless_the_spec_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_max: str | None, expected: int | None
) -> None:
    cpus = len(os.sched_getaffinity(0))
    v2 = tmp_path / "cpu.max"
    if cpu_max is not None:
        v2.write_text(cpu_max)
    monkeypatch.setattr(scoring, "CGROUP_V2_CPU_MAX", v2)
    monkeypatch.setattr(scoring, "CGROUP_V1_CPU", tmp_path / "no-v1")
    assert pool_size(CodeSpec()) == (cpus if expected is None else min(expected, cpus))
    assert pool_size(CodeSpec(workers=3)) == 3


def test_a_cgroup_v1_quota_caps_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    monkeypatch.setattr(scoring, "CGROUP_V2_CPU_MAX", tmp_path / "absent")
    monkeypatch.setattr(scoring, "CGROUP_V1_CPU", tmp_path)
    assert scoring.cgroup_cpu_limit() == 1.0 and pool_size(CodeSpec()) == 1


def test_programs_run_concurrently_and_the_event_loop_never_waits() -> None:
    # 3 s per test: a correct program must never reach it, even when a loaded machine takes
    # most of a second to start its interpreter (0.4 s did, once, on 2 cores running two runs).
    spec = CodeSpec(workers=4, test_timeout_seconds=3.0)
    metrics = GeneratorMetrics("ns", "r")
    scorer = Scorer("code", spec, metrics)
    # Four completions: right, wrong, too slow for the 3 s per test, crashing.
    pairs = [(RIGHT, ADD), ("print(0)", ADD), (SLOW, ADD), ("raise SystemExit(2)", ADD)]
    ticks: list[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def main() -> list[float | None]:
        stop = asyncio.Event()
        beat = asyncio.create_task(ticker(stop))
        rewards = await scorer.score(pairs)
        stop.set()
        await beat
        return rewards

    started = time.monotonic()
    try:
        rewards = asyncio.run(main())
    finally:
        scorer.close()
    elapsed = time.monotonic() - started
    assert rewards == [1.0, -1.0, -1.0, -1.0]
    # The loop kept ticking while programs ran (the slow one alone takes 3 s): a loop that
    # waited on them ticks once before and never again. A loaded machine's scheduler thins the
    # ticks and stretches their gaps (a count per elapsed second, and then the longest gap, each
    # failed once on 2 cores running two other runs), but cannot take them away.
    assert elapsed >= 3.0
    assert len(ticks) >= 5
    # Tests run: 3 (right) + 1 (wrong, stops early) + 1 (timeout) + 1 (crash).
    assert _value(metrics, "scalerl_code_tests_total") == 6
    assert _value(metrics, "scalerl_code_test_timeouts_total") == 1
    assert _value(metrics, "scalerl_code_execution_seconds_count") == 4


def test_a_failed_sandbox_drops_the_sample_and_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if isolation.probe().mode != "bwrap":
        pytest.skip("breaks bubblewrap on purpose; this machine runs without it")
    metrics = GeneratorMetrics("ns", "r")
    scorer = Scorer("code", CodeSpec(workers=2), metrics)
    monkeypatch.setattr(
        isolation, "bwrap_argv", lambda python, fresh=True, proc=True: ["bwrap", "--bad-flag"]
    )
    try:
        rewards = asyncio.run(scorer.score([(RIGHT, ADD), (RIGHT, ADD)]))
    finally:
        scorer.close()
    assert rewards == [None, None]
    assert _value(metrics, "scalerl_sandbox_failures_total") == 2


def test_string_rewards_score_inline() -> None:
    scorer = Scorer("exact")
    assert scorer.pool is None
    assert asyncio.run(scorer.score([("a", "a"), ("a", "b")])) == [1.0, -1.0]
