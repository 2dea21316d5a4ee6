"""What goes to a tracker (`Record`), the run it goes to (`TrackedRun`), and the journal that
keeps every record on the run's volume until each tracker has it.

The journal is what makes a restart neither lose nor repeat a step. Each process that logs (its
`role`: the trainer; the fit) appends every record to `tracking/<role>.jsonl` in the run
directory before handing it to the trackers, and each tracker's delivery thread keeps in
`tracking/<role>-<tracker>.json` the last step of each kind it has delivered. A resumed process
(step S from its checkpoint) drops the journal's steps after S (it redoes them), sends each tracker
what it had not delivered up to S, and skips what a tracker already has.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

TRACKING_DIR = "tracking"
# On a cluster the operator sets the run's uid in the pods that log: the tracker run's identity.
RUN_UID_ENV = "SCALERL_RUN_UID"
# The run directory (the run's folder on its volume), where a pod that logs has it mounted: the
# fit Job's, for W&B's offline files (scalerl.tracking.fit_job).
RUN_DIR_ENV = "SCALERL_RUN_DIR"

Kind = Literal["params", "step", "eval", "fit"]
# Kinds a resumed process redoes after its checkpoint's step (a fit is remade from the history,
# which the checkpoint restores: a later fit of the same step is the same fit).
REDONE: tuple[Kind, ...] = ("step", "eval")


@dataclass(frozen=True)
class Record:
    kind: Kind
    step: int  # training step (params: 0; a fit: the step of its last evaluation)
    metrics: dict[str, float] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)  # the spec, nested (kind params)
    image: str | None = None  # a PNG to attach (the fit's curve)
    time: float = field(default_factory=time.time)  # when it happened: the trackers' wall time

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, line: str) -> Record:
        return cls(**json.loads(line))


@dataclass(frozen=True)
class TrackedRun:
    """Who logs, and to which tracker run: the same `id` for every process and attempt of one
    ScaleRLRun (its uid on a cluster; locally a digest of its name and run directory)."""

    id: str
    name: str
    namespace: str
    role: str  # "trainer" or "fit": the process logging
    run_dir: Path

    @classmethod
    def of(cls, name: str, namespace: str, run_dir: Path, role: str) -> TrackedRun:
        uid = os.environ.get(RUN_UID_ENV)
        if not uid:
            where = f"{namespace}/{name}:{run_dir.resolve()}"
            uid = hashlib.sha256(where.encode()).hexdigest()[:16]
        return cls(uid, name, namespace, role, run_dir)

    @property
    def folder(self) -> Path:
        return self.run_dir / TRACKING_DIR


class Journal:
    """The role's records, in order, on the run's volume."""

    def __init__(self, run: TrackedRun) -> None:
        self.path = run.folder / f"{run.role}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def read(self) -> list[Record]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        out = []
        for line in lines:
            try:
                out.append(Record.from_json(line))
            except (json.JSONDecodeError, TypeError):
                continue  # a line cut short by a kill: its step is redone
        return out

    def resume(self, step: int | None) -> list[Record]:
        """The records that stand after a resume from `step` (None: nothing is redone); the
        journal is rewritten to hold just those."""
        records = self.read()
        if step is None:
            return records
        kept = [r for r in records if r.kind not in REDONE or r.step <= step]
        if len(kept) != len(records):
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(r.to_json() + "\n" for r in kept))
            os.replace(tmp, self.path)
        return kept

    def append(self, record: Record) -> None:
        with self.path.open("a") as f:
            f.write(record.to_json() + "\n")


class Delivered:
    """The last step of each kind one tracker has from one role (params: 0 once sent), and the
    record being delivered (`pending`): a process killed between delivering a record and
    noting it leaves that record in doubt, which the next start settles."""

    def __init__(self, run: TrackedRun, tracker: str) -> None:
        self.path = run.folder / f"{run.role}-{tracker}.json"
        try:
            saved = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            saved = {}
        self.pending: dict[str, Any] | None = saved.pop("pending", None)
        self.steps: dict[str, int] = saved

    def has(self, record: Record) -> bool:
        return record.step <= self.steps.get(record.kind, -1)

    def begin(self, record: Record) -> None:
        key = next(iter(record.metrics), "")
        self.pending = {"kind": record.kind, "step": record.step, "key": key}
        self._save()

    def mark(self, record: Record) -> None:
        self.steps[record.kind] = max(record.step, self.steps.get(record.kind, -1))
        self.pending = None
        self._save()

    def settle(self, delivered: bool) -> None:
        """The pending record was (True) or was not (False) delivered."""
        if self.pending is not None and delivered:
            kind, step = self.pending["kind"], int(self.pending["step"])
            self.steps[kind] = max(step, self.steps.get(kind, -1))
        self.pending = None
        self._save()

    def clamp(self, kept: int) -> None:
        """The tracker holds the redone kinds' steps through `kept` only. One that holds no
        step (-1) may not hold the params either (trackio stores them with the first step):
        they go again, which is harmless where they were kept."""
        if self.pending is not None and self.pending["kind"] in REDONE:
            self.settle(int(self.pending["step"]) <= kept)
        for kind in REDONE:
            if kind in self.steps:
                self.steps[kind] = min(self.steps[kind], kept)
        if kept < 0:
            self.steps.pop("params", None)
        self._save()

    def rewind(self, step: int) -> int:
        """For a tracker that rewrites a resumed run's steps (TensorBoard): forget the redone
        kinds' steps after `step`, and any in doubt; the step from which it rewrites is the
        returned one + 1."""
        floor = step
        if self.pending is not None and self.pending["kind"] in REDONE:
            floor = min(floor, int(self.pending["step"]) - 1)
        for kind in REDONE:
            if kind in self.steps:
                self.steps[kind] = min(self.steps[kind], floor)
        self.pending = None
        self._save()
        return floor

    def _save(self) -> None:
        saved: dict[str, Any] = dict(self.steps)
        if self.pending is not None:
            saved["pending"] = self.pending
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, self.path)
