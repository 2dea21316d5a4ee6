"""The generator's scorer: code runs in a pool of threads sized to the CPUs while the event loop
(and with it the engine) keeps going; sandbox failures drop the sample and are counted."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from scalerl.generator.scoring import Scorer, pool_size
from scalerl.metrics import GeneratorMetrics
from scalerl.sandbox import isolation
from scalerl.spec import CodeSpec

ADD = json.dumps({"inputs": ["1 2\n", "3 4\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]})
RIGHT = "a, b = map(int, input().split())\nprint(a + b)\n"
SLOW = "import time\ntime.sleep(0.6)\n" + RIGHT


def _value(metrics: GeneratorMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name, {"namespace": "ns", "run": "r"})
    return 0.0 if value is None else value


def test_the_pool_has_one_worker_per_usable_cpu_unless_the_spec_says() -> None:
    assert pool_size(CodeSpec()) == len(os.sched_getaffinity(0))
    assert pool_size(CodeSpec(workers=3)) == 3


def test_programs_run_concurrently_and_the_event_loop_never_waits() -> None:
    spec = CodeSpec(workers=4, test_timeout_seconds=0.4)
    metrics = GeneratorMetrics("ns", "r")
    scorer = Scorer("code", spec, metrics)
    # Four completions: right, wrong, too slow for the 0.4 s per test, crashing.
    pairs = [(RIGHT, ADD), ("print(0)", ADD), (SLOW, ADD), ("raise SystemExit(2)", ADD)]
    ticks = 0

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
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
    assert ticks >= 0.5 * elapsed / 0.01  # the loop kept ticking while programs ran
    # Tests run: 3 (right) + 1 (wrong, stops early) + 1 (timeout) + 1 (crash).
    assert _value(metrics, "scalerl_code_tests_total") == 6
    assert _value(metrics, "scalerl_code_test_timeouts_total") == 1
    assert _value(metrics, "scalerl_code_execution_seconds_count") == 4


def test_a_failed_sandbox_drops_the_sample_and_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if isolation.probe().mode != "bwrap":
        pytest.skip("breaks bubblewrap on purpose; this machine runs without it")
    metrics = GeneratorMetrics("ns", "r")
    scorer = Scorer("code", CodeSpec(workers=2), metrics)
    monkeypatch.setattr(isolation, "bwrap_argv", lambda folder, python: ["bwrap", "--bad-flag"])
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
