"""How a generator process meets the trainer (Generator.start): a replacement of a pool's only
generator, whose Start names no member, asks to be let in; a gang member whose group the trainer
gave up joins the next one."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from test_main_evaluation import code_generator

from scalerl.errors import PeerError, WeightSyncError
from scalerl.generator.scoring import Scorer
from scalerl.metrics import GeneratorMetrics
from scalerl.rollout import GeneratorChannel, TrainerChannel
from scalerl.rollout.records import Ready, Regroup, Start, Stop, UpdateWeights
from scalerl.spec import CodeSpec

T = TypeVar("T")


@dataclass
class IdleEngine:
    """An engine that starts at once and records the weight-sync groups it joins."""

    colocation: None = None
    version: int = 0
    joined: list[tuple[Any, ...]] = field(default_factory=list)

    async def start(self) -> float:
        return 0.0

    refuse: int = 0  # how many joins fail first, as one rank 0 gave up does

    async def init_weight_sync(self, *args: Any, **kwargs: Any) -> None:
        self.joined.append((*args, kwargs["generation"]))
        if len(self.joined) <= self.refuse:
            raise WeightSyncError("rank 0 gave this generation up (ranks [2] are gone)")

    async def update_weights(self, version: int, timeout_s: float) -> float:
        self.version = version
        return 0.0


def generator_on(tmp_path: Path, engine: IdleEngine) -> Any:
    metrics = GeneratorMetrics("ns", "code")
    generator = code_generator(tmp_path, Scorer("exact", CodeSpec(), metrics), metrics)
    generator.engine = engine  # type: ignore[assignment]
    return generator


def with_trainer(generator: Any, meet: Callable[[TrainerChannel], Coroutine[Any, Any, T]]) -> T:
    """`meet` (the trainer's side) against `generator`, over a real channel on loopback."""
    with (
        TrainerChannel("tcp://127.0.0.1:*") as trainer,
        GeneratorChannel(trainer.endpoint, generator.index, linger_s=0) as channel,
    ):
        generator.channel = channel
        return asyncio.run(meet(trainer))


def test_the_replacement_of_a_pools_only_generator_asks_to_be_let_in(tmp_path: Path) -> None:
    """The trainer lost its only generator: the replacement's Start names no member. It asks to
    be let in (Ready) and joins no group of its own, as it would at a gang's start (there the
    trainer never let it in: the cluster run's replaced generator that never joined)."""
    generator = generator_on(tmp_path, IdleEngine())

    async def meet(trainer: TrainerChannel) -> Any:
        starting = asyncio.create_task(generator.start())
        await asyncio.to_thread(trainer.wait_for_generators, 1, 10.0)
        curriculum = generator.curriculum.state_dict()
        trainer.send(0, Start(version=3, step=3, curriculum=curriculum, members=[]))
        asked = await asyncio.to_thread(trainer.recv, 10.0)
        trainer.send(0, Stop("the test is over"))
        with pytest.raises(PeerError, match="before Regroup"):
            await starting
        return asked

    asked = with_trainer(generator, meet)
    assert asked == (0, Ready(generator=0))
    assert generator.engine.joined == []


def test_a_gang_member_whose_group_was_given_up_joins_the_next(tmp_path: Path) -> None:
    """Generator 1 died as the gang started: the trainer gave up generation 0 and forms
    generation 1 of generator 0 alone. Generator 0 leaves generation 0, joins generation 1 at
    its new rank from where the run stands then, and loads the run's weights (a fresh run's
    too: they follow every formation), instead of failing its start."""
    generator = generator_on(tmp_path, IdleEngine(refuse=1))
    consumed = {"p3": [0]}

    async def meet(trainer: TrainerChannel) -> None:
        starting = asyncio.create_task(generator.start())
        await asyncio.to_thread(trainer.wait_for_generators, 1, 10.0)
        curriculum = generator.curriculum.state_dict()
        trainer.send(0, Start(version=0, step=0, curriculum=curriculum, members=[0, 1]))
        trainer.send(0, Regroup(1, [0], curriculum, consumed))
        trainer.send(0, UpdateWeights(version=0))
        await asyncio.wait_for(starting, 10.0)

    with_trainer(generator, meet)
    # (world size, rank, ..., generation): rank 1 of 3 in generation 0, then rank 1 of 2 in 1.
    joined = [(args[2], args[3], args[-1]) for args in generator.engine.joined]
    assert joined == [(3, 1, 0), (2, 1, 1)]
    assert generator.members == [0]
    assert generator.consumed == consumed


def test_a_generator_the_trainer_gave_up_exits_failed_so_that_it_is_replaced(
    tmp_path: Path,
) -> None:
    """Stop with `lost`: the trainer gave this generator up (it sent nothing for the peer timeout
    while the others did). A process that reads it was only slow; it fails (and its runner or
    Job replaces it) instead of finishing as at the run's end, which would leave it unreplaced."""
    generator = generator_on(tmp_path, IdleEngine())

    async def told(trainer: TrainerChannel) -> None:
        await asyncio.to_thread(generator.channel.hello, 5.0)
        await asyncio.to_thread(trainer.wait_for_generators, 1, 10.0)
        trainer.send(0, Stop("unresponsive: no rollouts for 300 s", lost=True))
        await asyncio.wait_for(generator.command_loop(), 10.0)

    with pytest.raises(PeerError, match="the trainer gave generator 0 up: unresponsive"):
        with_trainer(generator, told)


def test_a_replacement_whose_first_group_was_given_up_joins_the_next(tmp_path: Path) -> None:
    """A replacement is let in (generation 2), and another member dies as that generation forms:
    the trainer gives it up and forms generation 3 without the dead one. The replacement follows
    to generation 3 instead of failing (it failed, and, dying again before a step, restarted the
    gang: tests/test_local_chaos.py)."""
    generator = generator_on(tmp_path, IdleEngine(refuse=1))

    async def meet(trainer: TrainerChannel) -> None:
        starting = asyncio.create_task(generator.start())
        await asyncio.to_thread(trainer.wait_for_generators, 1, 10.0)
        curriculum = generator.curriculum.state_dict()
        trainer.send(1, Start(version=4, step=4, curriculum=curriculum, members=[0]))
        assert await asyncio.to_thread(trainer.recv, 10.0) == (1, Ready(generator=1))
        trainer.send(1, Regroup(2, [0, 1], curriculum, {}))
        trainer.send(1, Regroup(3, [1], curriculum, {"p3": [0]}))
        trainer.send(1, UpdateWeights(version=4))
        await asyncio.wait_for(starting, 10.0)

    generator.env = dataclasses.replace(generator.env, generator_index=1)
    with_trainer(generator, meet)
    joined = [(args[2], args[3], args[-1]) for args in generator.engine.joined]
    assert joined == [(3, 2, 2), (2, 1, 3)]  # rank 2 of 3 in generation 2, rank 1 of 2 in 3
    assert generator.members == [1] and generator.engine.version == 4
    assert generator.consumed == {"p3": [0]}
