"""The colocated mode's parts that need no engine: the device turnstile and the weight hand-off."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch

from scalerl.errors import WeightSyncError
from scalerl.generator.inproc import Handoff, Turnstile


def test_a_hold_waits_for_the_step_under_way() -> None:

    turnstile = Turnstile()
    log: list[str] = []

    class SlowEngine:
        def step(self) -> list[Any]:
            log.append("step begins")
            time.sleep(0.1)
            log.append("step ends")
            return []

    async def one_step() -> None:
        turnstile.attach(SlowEngine(), asyncio.get_running_loop(), sleep=False)  # type: ignore[arg-type]
        await turnstile.step(SlowEngine())  # type: ignore[arg-type]

    def trainer() -> None:
        time.sleep(0.03)  # the step is under way
        with turnstile.hold():
            log.append("trainer holds")

    thread = threading.Thread(target=trainer)
    thread.start()
    asyncio.run(one_step())
    thread.join()
    assert log == ["step begins", "step ends", "trainer holds"]


def test_the_engine_loads_exactly_the_offered_tensors_and_the_trainer_is_released() -> None:
    handoff = Handoff()
    weights = [("w", torch.ones(2)), ("b", torch.zeros(1))]
    handoff.offer(4, iter(weights))
    released = threading.Event()

    def trainer() -> None:
        handoff.wait(5.0)
        released.set()

    thread = threading.Thread(target=trainer)
    thread.start()
    time.sleep(0.05)
    assert not released.is_set(), "the trainer went on before the engine loaded its tensors"
    with handoff.receive(4) as named:
        assert [n for n, _ in named] == ["w", "b"]
        assert named[0][1] is weights[0][1]  # by reference: nothing copied on the trainer's side
    thread.join(5.0)
    assert released.is_set()


def test_a_load_that_fails_fails_the_trainer_with_its_reason() -> None:
    handoff = Handoff()
    handoff.offer(2, [])
    with pytest.raises(RuntimeError), handoff.receive(2):
        raise RuntimeError("no parameter named lm_head.weight")
    with pytest.raises(WeightSyncError, match="no parameter named lm_head.weight"):
        handoff.wait(0.0)
