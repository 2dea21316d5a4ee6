"""trackio (`spec.tracking.trackio`): local-first, a SQLite database under TRACKIO_DIR (or a
Hugging Face Space when TRACKIO_SPACE_ID is set, with HF_TOKEN). Not in the `tracking` extra:
trackio (0.25 to 0.43) pins pillow below 13, older than this project's; install it yourself
(`pip install trackio`) where that suits (tests/tracking tests it in a venv of its own). The run
is `<name>-<first 8 of its id>` (trackio's only identity of a run), resumed by that name
(`resume="allow"`), in the group `<name>`; the fit logs to `<that>-fit`, with its curve as an
image.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trackio

from scalerl.tracking.names import FIT_CURVE
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
            project=self.spec.project,
            name=self.run_name,
            group=self.run.name,
            resume="allow",
            config=self.stored_config(),
        )

    def stored_config(self) -> dict[str, Any]:
        """The spec an earlier attempt logged: trackio stores a run's config again with the
        first record after each init, so a resumed run (which does not log its params again)
        would lose it."""
        if os.environ.get("TRACKIO_SPACE_ID"):
            return {}  # a Space holds the run and keeps its config
        from trackio.sqlite_storage import SQLiteStorage

        if not SQLiteStorage.get_project_db_path(self.spec.project).exists():
            return {}
        stored = SQLiteStorage.get_run_config(self.spec.project, self.run_name) or {}
        return {k: v for k, v in stored.items() if not k.startswith("_")}  # trackio's own keys

    @property
    def run_name(self) -> str:
        """trackio knows a run by its name only: the ScaleRLRun's name and the start of its id,
        so two runs of one name (other namespaces, other run directories) stay apart."""
        name = f"{self.run.name}-{self.run.id[:8]}"
        return name if self.run.role == "trainer" else f"{name}-{self.run.role}"

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
        data: dict[str, Any] = dict(record.metrics)
        if record.image and Path(record.image).exists():
            data[FIT_CURVE] = trackio.Image(record.image)
        if data:
            self.handle.log(data, step=record.step)

    def close(self, finished: bool) -> None:
        self.handle.finish()
