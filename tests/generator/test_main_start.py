"""How a generator process meets the trainer (Generator.start): a replacement of a pool's only
generator, whose Start names no member, asks to be let in."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from test_main_evaluation import code_generator

from scalerl.errors import PeerError
from scalerl.generator.scoring import Scorer
from scalerl.metrics import GeneratorMetrics
from scalerl.rollout import GeneratorChannel, TrainerChannel
from scalerl.rollout.records import Ready, Start, Stop
from scalerl.spec import CodeSpec


@dataclass
class IdleEngine:
    """An engine that starts at once and records the weight-sync groups it joins."""

    colocation: None = None
    version: int = 0
    joined: list[tuple[Any, ...]] = field(default_factory=list)

    async def start(self) -> float:
        return 0.0

    async def init_weight_sync(self, *args: Any, **kwargs: Any) -> None:
        self.joined.append(args)


def test_the_replacement_of_a_pools_only_generator_asks_to_be_let_in(tmp_path: Path) -> None:
    """The trainer lost its only generator: the replacement's Start names no member. It asks to
    be let in (Ready) and joins no group of its own, as it would at a gang's start (there the
    trainer never let it in: the cluster run's replaced generator that never joined)."""
    metrics = GeneratorMetrics("ns", "code")
    generator = code_generator(tmp_path, Scorer("exact", CodeSpec(), metrics), metrics)
    generator.engine = IdleEngine()  # type: ignore[assignment]

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

    with (
        TrainerChannel("tcp://127.0.0.1:*") as trainer,
        GeneratorChannel(trainer.endpoint, 0, linger_s=0) as channel,
    ):
        generator.channel = channel
        asked = asyncio.run(meet(trainer))
    assert asked == (0, Ready(generator=0))
    assert generator.engine.joined == []  # type: ignore[attr-defined]
