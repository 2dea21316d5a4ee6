"""Where trainer 0's wall time goes, phase by phase, over the whole run.

The totals go into every evaluation of the history (`trainer_seconds`: each phase, `other` and
`wall`), next to the generators' own totals, so `bench/step_profile.py` reads a whole run's profile
from its `history.jsonl`. A resumed run starts from the totals its checkpoint saved, as its step
and compute do.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = (
    "start",  # the generators' start-up (vLLM) to the sync group, and a resumed run's weights
    "wait_rollouts",  # blocked until the generators deliver a batch's groups
    "build_batch",  # advantages, filters, padding
    "forward_backward",  # every micro-batch's forward and backward
    "optimizer",  # clipping, AdamW, the schedule
    "broadcast",  # gathering and sending new weights
    "evaluate",  # asking for held-out pass rates and waiting for them
    "checkpoint",
)


class Phases:
    """Seconds per phase. Phases may nest: time goes to the innermost phase only, so the phases
    never overlap and add up to the wall time."""

    def __init__(self, spent: dict[str, float] | None = None) -> None:
        """`spent`: the totals of earlier attempts (`totals()` as a checkpoint saved them)."""
        spent = spent or {}
        self.seconds = {phase: spent.get(phase, 0.0) for phase in PHASES}
        self.spent_other = spent.get("other", 0.0)
        self.spent_wall = spent.get("wall", 0.0)
        self.started = time.monotonic()
        self._inner: list[float] = []  # per open phase: seconds already given to phases inside
        self._open: list[tuple[str, float]] = []  # the open phases, outermost first: name, start

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds
        if self._inner:
            self._inner[-1] += seconds

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        started = time.monotonic()
        self._inner.append(0.0)
        self._open.append((phase, started))
        try:
            yield
        finally:
            self._open.pop()
            elapsed = time.monotonic() - started
            self.seconds[phase] += elapsed - self._inner.pop()
            if self._inner:
                self._inner[-1] += elapsed

    def steady(self) -> float:
        """Wall seconds so far that went to steady work: not start-up, evaluations or
        checkpoints (what steps cost, as opposed to what the run pays now and then)."""
        wall = self.spent_wall + time.monotonic() - self.started
        return wall - sum(self.seconds[p] for p in ("start", "evaluate", "checkpoint"))

    def totals(self) -> dict[str, float]:
        """Seconds of every phase, `other` (status, metrics, the loop itself) and the `wall`
        time they add up to."""
        now = time.monotonic()
        wall = self.spent_wall + now - self.started
        out = dict(self.seconds)
        # A phase still open (an evaluation records its history row from inside its own phase)
        # has had its time so far: else `other` took it, and the row's phases disagreed with
        # the compute clock, which stops for evaluations as they start.
        ends = [started for _, started in self._open[1:]] + [now] * bool(self._open)
        for (phase, started), inner, end in zip(self._open, self._inner, ends, strict=True):
            out[phase] += end - started - inner
        out["other"] = max(wall - sum(out.values()), 0.0)
        out["wall"] = wall
        return out
