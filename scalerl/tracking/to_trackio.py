"""trackio (`spec.tracking.trackio`): local-first, a SQLite database under TRACKIO_DIR (or a
Hugging Face Space when TRACKIO_SPACE_ID is set, with HF_TOKEN). Not in the `tracking` extra:
trackio 0.43 pins pillow below 13, older than this project's; install it yourself
(`pip install trackio`) where that suits. The run is named after the ScaleRLRun and resumed by
that name (`resume="allow"`); the fit logs to `<name>-fit` in the same group.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from typing import TYPE_CHECKING, Any

import trackio

from scalerl.tracking.records import Record, TrackedRun

if TYPE_CHECKING:
    from scalerl.spec import TrackioTracking


class TrackioTracker:
    name = "trackio"
    rewrites = False

    def __init__(self, spec: TrackioTracking, run: TrackedRun) -> None:
        self.spec, self.run = spec, run
        self.handle: Any = None
        self.config: dict[str, Any] = {}

    def confirm(self, kind: str, step: int, key: str) -> bool | None:
        return None  # no reading back here: a record in doubt counts as delivered

    def open(self, purge_step: int | None) -> None:
        self.handle = trackio.init(
            project=self.spec.project, name=self.run_name, group=self.run.name, resume="allow"
        )

    @property
    def run_name(self) -> str:
        role = self.run.role
        return self.run.name if role == "trainer" else f"{self.run.name}-{role}"

    def kept_through(self) -> int | None:
        """trackio writes what it took from a background thread, so a killed process loses
        the last records: the steps its local database holds (its documented schema)."""
        if os.environ.get("TRACKIO_SPACE_ID"):
            return None  # a Space holds the run: nothing to read here
        from trackio.sqlite_storage import SQLiteStorage

        path = SQLiteStorage.get_project_db_path(self.spec.project)
        if not path.exists():
            return -1  # nothing written yet: trackio makes it with its first record
        with closing(sqlite3.connect(path)) as db:
            try:
                (last,) = db.execute(
                    "SELECT MAX(step) FROM metrics WHERE run_name = ?", (self.run_name,)
                ).fetchone()
            except sqlite3.OperationalError:  # no metrics table yet
                return -1
        return -1 if last is None else int(last)

    def log(self, record: Record) -> None:
        if record.kind == "params":
            self.handle.config.update(record.params)
            return
        if record.metrics:
            self.handle.log(dict(record.metrics), step=record.step)

    def close(self, finished: bool) -> None:
        self.handle.finish()
