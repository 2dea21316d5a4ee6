"""The colocated mode's parts that need no engine: the device turnstile, a load too early, how a
CPU's cores are shared."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch

from scalerl.errors import WeightSyncError
from scalerl.generator.colocation import Colocation, CoreShare, Turnstile


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


# --- sharing a CPU's cores ---------------------------------------------------------------------


@pytest.fixture
def threads() -> Any:
    """Torch's thread count on this thread, restored after the test."""
    before = torch.get_num_threads()
    yield
    torch._C.set_num_threads(before)  # torch's own: an in-process vLLM engine replaces the other


def trial(share: CoreShare, shared_s: float, turns_s: float) -> list[tuple[bool, int]]:
    """Feed `share` a start-up step, then per-step seconds as each way would take them; record
    (exclusive, torch threads) after each step."""
    seen = []
    share.observe(60.0)  # the first step: start-up, not counted
    for _ in range(4 * share.window):
        share.observe(turns_s if share.exclusive else shared_s)
        seen.append((share.exclusive, torch.get_num_threads()))
    return seen


@pytest.mark.usefixtures("threads")
def test_a_run_that_trains_faster_with_every_core_takes_turns() -> None:
    share = CoreShare(cores=4, window=2)
    assert (share.exclusive, torch.get_num_threads()) == (True, 4)  # it starts in turns
    seen = trial(share, shared_s=3.7, turns_s=2.8)
    # Two steps in turns (every core), two sharing (one core left to the engine), then turns.
    assert seen[:4] == [(True, 4), (False, 3), (False, 3), (True, 4)]
    assert share.chosen and set(seen[4:]) == {(True, 4)}


@pytest.mark.usefixtures("threads")
def test_a_run_that_samples_faster_while_training_keeps_sharing() -> None:
    share = CoreShare(cores=2, window=4)
    seen = trial(share, shared_s=0.18, turns_s=0.29)  # the demo's steps with LoRA
    assert seen[3:8] == [(False, 1)] * 5
    assert share.chosen and set(seen[7:]) == {(False, 1)}


@pytest.mark.usefixtures("threads")
def test_colocation_follows_its_share_step_by_step() -> None:
    colocation = Colocation(share=CoreShare(cores=2, window=1))
    with colocation.train():
        assert colocation.turnstile._wanted.is_set()  # the engine waits while the trainer steps
    colocation.stepped(9.0)  # start-up
    colocation.stepped(2.0)  # in turns
    assert not colocation.exclusive  # now trying to share
    with colocation.train():
        assert not colocation.turnstile._wanted.is_set()
    colocation.stepped(3.0)  # sharing was slower
    assert colocation.exclusive
    with colocation.train():
        assert colocation.turnstile._wanted.is_set()


@pytest.mark.usefixtures("threads")
def test_the_share_holds_after_vllm_replaces_torch_s_thread_setter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM's CPU worker makes torch.set_num_threads a no-op in the process its engine runs in:
    # the colocated trainer's, and any test process that started one before this test.
    monkeypatch.setattr(torch, "set_num_threads", lambda count: None)
    share = CoreShare(cores=4, window=2)
    assert (share.exclusive, torch.get_num_threads()) == (True, 4)
    share.exclusive = False
    share.apply()
    assert torch.get_num_threads() == 3
