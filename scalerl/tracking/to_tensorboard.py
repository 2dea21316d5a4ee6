"""TensorBoard (`spec.tracking.tensorboard`): event files written with tensorboardX's record
writer and summaries (no TensorFlow, no torch) in `<dir>/<run name>` (relative to the run
directory), the fits in its `fit/` folder: TensorBoard follows only the newest file of a folder, so
two processes writing at once need two folders.

Every record is in the file when `log` returns: a record the sink notes as delivered must survive
a SIGKILL. tensorboardX's SummaryWriter queues events for a background thread and its `flush`
does not wait for that queue, so a record logged just before a kill was lost while the sink
counted it delivered (a resumed run's TensorBoard then lacked that step's evaluation). The events
are written here synchronously instead.

A resumed trainer writes again every step after its checkpoint's, and opens its file with
`purge_step`: TensorBoard's reader drops what earlier files hold from that step on, so each step
reads once, with the values of the attempt that went on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.summary import image, scalar, text

from scalerl.tracking.names import FIT_CURVE
from scalerl.tracking.records import Record, TrackedRun

if TYPE_CHECKING:
    from scalerl.spec import TensorboardTracking


class TensorboardTracker:
    name = "tensorboard"
    rewrites = True

    def __init__(self, spec: TensorboardTracking, run: TrackedRun) -> None:
        self.logdir = run.run_dir / spec.dir / run.name  # an absolute dir stays as it is
        if run.role != "trainer":
            self.logdir = self.logdir / run.role
        self.run = run
        self.writer: EventsWriter | None = None

    def open(self, purge_step: int | None) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        # The reader takes a folder's files in name order, and the name holds the second it
        # was opened: the nanoseconds after it order (and keep apart) two opened in one second.
        self.writer = EventsWriter(
            str(self.logdir / "events"), f".{time.time_ns()}.{self.run.role}"
        )
        if purge_step is not None:  # TensorBoard's reader drops earlier files' steps from here
            self.writer.write_event(
                Event(step=purge_step, session_log=SessionLog(status=SessionLog.START))
            )
        self.writer.flush()

    def confirm(self, kind: str, step: int, key: str) -> bool | None:
        return None  # never asked: a record in doubt is written again after the purge step

    def kept_through(self) -> int | None:
        return None  # what it took, it keeps

    def log(self, record: Record) -> None:
        assert self.writer is not None, "open first"
        summaries: list[Summary] = []
        if record.kind == "params":
            spec = yaml.safe_dump(json.loads(json.dumps(record.params)), sort_keys=False)
            summaries.append(text("spec", f"```yaml\n{spec}```"))
        summaries += [scalar(key, value) for key, value in record.metrics.items()]
        summaries += [text(key, words) for key, words in record.text.items()]
        if record.image and Path(record.image).exists():
            summaries.append(image(FIT_CURVE, _pixels(record.image), dataformats="HWC"))
        for summary in summaries:
            self.writer.write_event(Event(wall_time=record.time, step=record.step, summary=summary))
        self.writer.flush()  # to the OS: a killed process loses nothing it logged

    def close(self, finished: bool) -> None:
        if self.writer is not None:
            self.writer.close()


def _pixels(path: str) -> Any:
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))
