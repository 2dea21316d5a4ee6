"""Where a run stands in its training data: for each train prompt, the epochs in which a training
step took its group. It is part of every checkpoint, so a restarted run serves each prompt once
per epoch, as the run that never stopped would have, whatever the number of generators.

The rule for what a crash costs: a prompt is *consumed* when a training step takes its group
(trained on it, or dropped it as too stale or without signal). Groups generated but not yet taken
at the checkpoint (in flight, or waiting in the trainer's backlog) are not consumed: after a
restart they are served again, in the epoch they were first served in.

How a generator serves its shard (`EpochOrder`): epoch e is the shard's prompts in an order
fixed by the run's seed, the shard and e; a prompt is skipped where epoch e of it was served
already, or the curriculum dropped it. Epoch e + 1 starts only when every active prompt of the
shard was served in epoch e, and a restart starts from the earliest epoch a prompt still lacks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Dropped(Protocol):
    """The curriculum, as far as the order needs it."""

    def is_active(self, prompt_id: str) -> bool: ...


@dataclass
class DataPosition:
    """Prompt id -> the epochs in which a training step consumed it (sorted)."""

    consumed: dict[str, list[int]] = field(default_factory=dict)

    def consume(self, prompt_id: str, epoch: int) -> bool:
        """Record that a step took `prompt_id`'s group of `epoch`; False (nothing recorded) when
        that epoch of it was consumed already."""
        epochs = self.consumed.setdefault(prompt_id, [])
        if epoch in epochs:
            return False
        epochs.append(epoch)
        epochs.sort()
        return True

    def of(self, prompt_ids: Iterable[str]) -> dict[str, list[int]]:
        """The part of the position that concerns `prompt_ids` (a generator's shard)."""
        return {p: list(self.consumed[p]) for p in prompt_ids if p in self.consumed}

    def to_dict(self) -> dict[str, list[int]]:
        return {p: list(epochs) for p, epochs in self.consumed.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Iterable[int]]) -> DataPosition:
        return cls({str(p): sorted(int(e) for e in epochs) for p, epochs in data.items()})


T = TypeVar("T")


class EpochOrder(Generic[T]):
    """Endless epochs over a shard, each in its own seeded order, from a data position on.

    `items` are the shard's prompts, `key` their ids; `served` the epochs each was already
    served in (a resumed run: the epochs it was consumed in). Iterating yields (item, epoch).
    """

    def __init__(
        self,
        items: list[T],
        key: Callable[[T], str],
        seed: str,
        served: Mapping[str, Iterable[int]] | None = None,
        curriculum: Dropped | None = None,
    ) -> None:
        self.items = items
        self.key = key
        self.seed = seed
        self.served = {p: set(epochs) for p, epochs in (served or {}).items()}
        self.curriculum = curriculum

    def active(self) -> list[T]:
        curriculum = self.curriculum
        return [i for i in self.items if curriculum is None or curriculum.is_active(self.key(i))]

    def epoch(self) -> int | None:
        """The earliest epoch some active prompt was not served in; None: none is active."""
        lacking = [_first_missing(self.served.get(self.key(i), set())) for i in self.active()]
        return min(lacking) if lacking else None

    def order(self, epoch: int) -> list[T]:
        """Epoch `epoch` of the shard, whatever was served: the same list on every attempt."""
        shuffled = list(self.items)
        random.Random(f"{self.seed}/epoch-{epoch}").shuffle(shuffled)
        return shuffled

    def __iter__(self) -> Iterator[tuple[T, int]]:
        while (epoch := self.epoch()) is not None:
            for item in self.order(epoch):
                served = self.served.setdefault(self.key(item), set())
                if epoch in served:
                    continue
                if self.curriculum is not None and not self.curriculum.is_active(self.key(item)):
                    continue
                served.add(epoch)
                yield item, epoch


def _first_missing(epochs: set[int]) -> int:
    epoch = 0
    while epoch in epochs:
        epoch += 1
    return epoch
