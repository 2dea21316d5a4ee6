"""The data position and the epoch order of a generator's shard, as a restart uses them: any
sequence of serve / consume / checkpoint / crash / reshard keeps each prompt once per epoch, skips
none, and a run that restarts from a checkpoint with nothing in flight serves what the run that
never stopped would have."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.rollout.position import DataPosition, EpochOrder


@dataclass
class Curriculum:
    dropped: set[str] = field(default_factory=set)

    def is_active(self, prompt_id: str) -> bool:
        return prompt_id not in self.dropped


@dataclass
class Run:
    """Generators serving shards of `prompts`, and a trainer consuming what they served."""

    prompts: list[str]
    generators: int
    curriculum: Curriculum = field(default_factory=Curriculum)
    position: DataPosition = field(default_factory=DataPosition)
    saved: DataPosition = field(default_factory=DataPosition)
    in_flight: list[tuple[str, int]] = field(default_factory=list)
    orders: list[object] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start()

    def shard(self, g: int) -> list[str]:
        return self.prompts[g :: self.generators]

    def start(self) -> None:
        """A gang (re)starts: each generator from the data position the trainer holds."""
        self.in_flight = []
        self.orders = [
            iter(
                EpochOrder(
                    self.shard(g),
                    str,
                    seed=f"7/shard-{g}-of-{self.generators}",
                    served=self.position.of(self.shard(g)),
                    curriculum=self.curriculum,
                )
            )
            for g in range(self.generators)
        ]

    def serve(self, g: int) -> tuple[str, int] | None:
        served = next(self.orders[g % self.generators], None)  # type: ignore[call-overload]
        if served is None:
            return None
        prompt, epoch = served
        self.check_serving(g % self.generators, prompt, epoch)
        self.in_flight.append((prompt, epoch))
        return prompt, epoch

    def check_serving(self, g: int, prompt: str, epoch: int) -> None:
        seen = self.seen()
        assert epoch not in seen.get(prompt, set()), f"{prompt} served twice in epoch {epoch}"
        if epoch > 0:  # every active prompt of the shard went through the epoch before
            for other in self.shard(g):
                if self.curriculum.is_active(other):
                    assert epoch - 1 in seen.get(other, set()), f"{other} skipped epoch {epoch - 1}"

    def seen(self) -> dict[str, set[int]]:
        """Epochs of each prompt consumed, or served and still in flight."""
        out = {p: set(epochs) for p, epochs in self.position.consumed.items()}
        for prompt, epoch in self.in_flight:
            out.setdefault(prompt, set()).add(epoch)
        return out

    def consume(self, k: int) -> None:
        if self.in_flight:
            prompt, epoch = self.in_flight.pop(k % len(self.in_flight))
            assert self.position.consume(prompt, epoch), f"{prompt} consumed twice in {epoch}"

    def checkpoint(self) -> None:
        self.saved = DataPosition.from_dict(self.position.to_dict())

    def crash(self, generators: int | None = None) -> None:
        """Every process dies; the gang restarts from the last checkpoint (with as many
        generators as asked)."""
        self.position = DataPosition.from_dict(self.saved.to_dict())
        self.generators = generators or self.generators
        self.start()


OPS = st.one_of(
    st.tuples(st.just("serve"), st.integers(0, 3)),
    st.tuples(st.just("consume"), st.integers(0, 10)),
    st.tuples(st.just("checkpoint"), st.just(0)),
    st.tuples(st.just("crash"), st.just(0)),
    st.tuples(st.just("reshard"), st.integers(1, 4)),
    st.tuples(st.just("drop"), st.integers(0, 11)),
)


@settings(max_examples=300, deadline=None)
@given(
    prompts=st.integers(1, 12),
    generators=st.integers(1, 4),
    ops=st.lists(OPS, max_size=120),
)
def test_any_history_of_restarts_keeps_each_prompt_once_per_epoch_and_skips_none(
    prompts: int, generators: int, ops: list[tuple[str, int]]
) -> None:
    run = Run([f"p{i}" for i in range(prompts)], generators)
    for op, arg in ops:
        if op == "serve":
            run.serve(arg)
        elif op == "consume":
            run.consume(arg)
        elif op == "checkpoint":
            run.checkpoint()
        elif op == "crash":
            run.crash()
        elif op == "reshard":
            run.crash(arg)
        elif len(run.curriculum.dropped) < prompts - 1:
            run.curriculum.dropped.add(f"p{arg % prompts}")


def served_then_consumed(run: Run, batches: int, batch: int) -> list[list[str]]:
    """A PPO-like run: each batch is served and consumed whole before the next is served."""
    out = []
    for _ in range(batches):
        taken = [
            run.serve(g) for g in itertools.islice(itertools.cycle(range(run.generators)), batch)
        ]
        out.append(sorted(p for p, _ in filter(None, taken)))
        while run.in_flight:
            run.consume(0)
    return out


@settings(max_examples=100, deadline=None)
@given(
    prompts=st.integers(2, 20),
    generators=st.integers(1, 3),
    batch=st.integers(1, 6),
    crash_after=st.integers(0, 12),
)
def test_a_restart_with_nothing_in_flight_serves_what_the_run_that_never_stopped_would(
    prompts: int, generators: int, batch: int, crash_after: int
) -> None:
    names = [f"p{i}" for i in range(prompts)]
    whole = served_then_consumed(Run(names, generators), 16, batch)
    restarted = Run(names, generators)
    before = served_then_consumed(restarted, crash_after, batch)
    restarted.checkpoint()
    served_then_consumed(restarted, 2, batch)  # lost with the crash
    restarted.crash()
    after = served_then_consumed(restarted, 16 - crash_after, batch)
    assert before + after == whole


def test_the_position_round_trips_and_refuses_an_epoch_twice() -> None:
    position = DataPosition()
    assert position.consume("a", 0) and position.consume("a", 2) and position.consume("a", 1)
    assert not position.consume("a", 1)
    again = DataPosition.from_dict(copy.deepcopy(position.to_dict()))
    assert again.consumed == {"a": [0, 1, 2]}
    assert again.of(["a", "b"]) == {"a": [0, 1, 2]}
