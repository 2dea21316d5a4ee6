"""What a generator reports about its own time: idle (no group at all) and reward-wait (groups
in flight, none in the engine), read on a clock the test moves by hand."""

from __future__ import annotations

import pytest

from scalerl.generator import main
from scalerl.generator.main import Tally
from scalerl.metrics import GeneratorMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(main.time, "monotonic", clock)
    return clock


def test_the_engine_waits_for_rewards_only_while_no_group_is_in_it(clock: Clock) -> None:
    metrics = GeneratorMetrics("ns", "run")
    tally = Tally(metrics, started=clock.now, idle_since=clock.now)
    clock.now += 2  # idle: nothing in flight yet
    # Two groups: A is generated, then scored while B is still in the engine (no wait) ...
    tally.begin(), tally.generation_begins()
    tally.begin(), tally.generation_begins()
    clock.now += 1
    tally.generation_ends()  # A scores
    clock.now += 1
    tally.generation_ends()  # B scores too: from here the engine has nothing to do
    clock.now += 3
    tally.begin(), tally.generation_begins()  # C enters the engine: 3 s of waiting end
    clock.now += 1
    tally.end(), tally.end()  # A and B are scored and sent
    tally.generation_ends()  # C scores
    clock.now += 0.5
    tally.end()  # C is done: the last 0.5 s was a wait too, then idle
    clock.now += 4
    assert tally.reward_wait_s == pytest.approx(3.5)
    assert tally.idle_seconds() == pytest.approx(2 + 4)
    served = metrics.registry.get_sample_value(
        "scalerl_generator_reward_wait_seconds_total", {"namespace": "ns", "run": "run"}
    )
    assert served == pytest.approx(3.5)
