"""The colocated mode's parts that need no engine: the device turnstile, a load too early."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch

from scalerl.errors import WeightSyncError
from scalerl.generator.colocation import Colocation, Turnstile


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
        turnstile.attach(SlowEngine(), asyncio.get_running_loop())  # type: ignore[arg-type]
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


def test_a_load_before_the_engine_started_names_the_wait() -> None:
    with pytest.raises(WeightSyncError, match="did not start within 0.1 s to load version 3"):
        Colocation().load([("w", torch.ones(1))], 3, 0.1)
