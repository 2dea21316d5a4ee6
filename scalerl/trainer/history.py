"""What a trainer must carry across a restart besides model and optimizer, and its compute clock.

The history file and the run's other files are `scalerl.status.history`'s; the checkpoint holds
the evaluations so far, so a resumed run rewrites `history.jsonl` from it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from scalerl.recipe.curriculum import union


@dataclass
class TrainerState:
    """Everything besides model and optimizer that a checkpoint must restore."""

    step: int = 0
    version: int = 0
    compute_hours: float = 0.0
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # HistoryRow dicts
    # The run's No-Positive-Resampling state ({} before the first step): one for the whole data,
    # so a resumed run with another number of generators keeps every prompt's record.
    curriculum: dict[str, Any] = field(default_factory=dict)
    # The data position (scalerl.rollout.position): prompt id -> the epochs a step consumed it in.
    consumed: dict[str, list[int]] = field(default_factory=dict)
    batches: int = 0  # batches taken into training steps (updating or not)
    counters: dict[str, int] = field(default_factory=dict)
    # Run totals at the checkpoint, which a resumed run goes on from: the trainer's seconds per
    # phase (scalerl.trainer.profile) and the generators' totals (as of their last report).
    trainer_seconds: dict[str, float] = field(default_factory=dict)
    generation: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerState:
        if "curricula" in data and "curriculum" not in data:
            # A checkpoint with one curriculum per generator shard: their union is the run's
            # (each prompt belongs to one shard).
            data = {**data, "curriculum": union(list(data["curricula"].values()))}
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def bump(self, counter: str, by: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + by


class ComputeClock:
    """Training compute: wall hours x compute units while the clock runs, on top of what earlier
    attempts spent up to their checkpoint.

    It starts stopped and runs only while the run trains (steps, weight updates, checkpoints):
    start-up (model loads, engines, the first weight broadcast) and held-out evaluations are not
    training, so compute is 0 at the step-0 evaluation, a restart adds no start-up, and how often
    a run evaluates does not move its curve. Suspended time is never counted: the process is gone.
    """

    def __init__(self, units: int, spent_hours: float) -> None:
        self.units = units
        self.spent_hours = spent_hours
        self.since: float | None = None  # monotonic time it started running; None: stopped

    def start(self) -> None:
        if self.since is None:
            self.since = time.monotonic()

    def stop(self) -> None:
        if self.since is not None:
            self.spent_hours = self.hours()
            self.since = None

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """Not counting inside the block; running after it if it was before."""
        running = self.since is not None
        self.stop()
        try:
            yield
        finally:
            if running:
                self.start()

    def hours(self) -> float:
        if self.since is None:
            return self.spent_hours
        return self.spent_hours + (time.monotonic() - self.since) / 3600.0 * self.units
