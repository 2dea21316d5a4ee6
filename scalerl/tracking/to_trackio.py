"""trackio (`spec.tracking.trackio`): local-first, a SQLite database under TRACKIO_DIR (or a
Hugging Face Space when TRACKIO_SPACE_ID is set, with HF_TOKEN). Not in the `tracking` extra:
trackio 0.43 pins pillow below 13, older than this project's; install it yourself
(`pip install trackio`) where that suits. The run is named after the ScaleRLRun and resumed by
that name (`resume="allow"`); the fit logs to `<name>-fit` in the same group.
"""

from __future__ import annotations

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
        role = self.run.role
        self.handle = trackio.init(
            project=self.spec.project,
            name=self.run.name if role == "trainer" else f"{self.run.name}-{role}",
            group=self.run.name,
            resume="allow",
        )

    def kept_through(self) -> int | None:
        return None  # what it took, it keeps

    def log(self, record: Record) -> None:
        if record.kind == "params":
            self.handle.config.update(record.params)
            return
        if record.metrics:
            self.handle.log(dict(record.metrics), step=record.step)

    def close(self, finished: bool) -> None:
        self.handle.finish()
