"""What a run has done so far: the trainer's resumable state, the evaluation history file, the
live progress file and the compute clock.

`history.jsonl` holds one line per evaluation (step, compute, pass_rate, plus train metrics); it is
the input of `scalerl fit`. After a resume it is rewritten from the checkpoint, so evaluations made
after the checkpoint (and redone now) never appear twice.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HISTORY_FILE = "history.jsonl"
PROGRESS_FILE = "progress.json"


@dataclass
class TrainerState:
    """Everything besides model and optimizer that a checkpoint must restore."""

    step: int = 0
    version: int = 0
    compute_hours: float = 0.0
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    curricula: dict[str, dict[str, Any]] = field(default_factory=dict)  # generator index -> state
    counters: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerState:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def bump(self, counter: str, by: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + by


class ComputeClock:
    """Compute = wall hours x compute units, on top of what earlier attempts already spent.

    Only time while this process runs counts, so suspended time is excluded by construction.
    """

    def __init__(self, units: int, spent_hours: float) -> None:
        self.units = units
        self.spent_hours = spent_hours
        self.started = time.monotonic()

    def hours(self) -> float:
        return self.spent_hours + (time.monotonic() - self.started) / 3600.0 * self.units


class RunFiles:
    """The run directory's history and progress files."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.history = run_dir / HISTORY_FILE
        self.progress = run_dir / PROGRESS_FILE

    def rewrite_history(self, evaluations: list[dict[str, Any]]) -> None:
        atomic_write(self.history, "".join(json.dumps(e) + "\n" for e in evaluations))

    def append_history(self, evaluation: dict[str, Any]) -> None:
        with self.history.open("a") as f:
            f.write(json.dumps(evaluation) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_progress(self, progress: dict[str, Any]) -> None:
        atomic_write(self.progress, json.dumps(progress))


def read_history(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
