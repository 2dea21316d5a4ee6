"""TensorBoard (`spec.tracking.tensorboard`): event files written with tensorboardX's writer
(no TensorFlow, no torch) in `<dir>/<run name>` (relative to the run directory), the fits in its
`fit/` folder: TensorBoard follows only the newest file of a folder, so two processes writing at
once need two folders. Every record is flushed at once.

A resumed trainer writes again every step after its checkpoint's, and opens its file with
`purge_step`: TensorBoard's reader drops what earlier files hold from that step on, so each step
reads once, with the values of the attempt that went on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from tensorboardX import SummaryWriter

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
        self.writer: Any = None

    def open(self, purge_step: int | None) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(
            str(self.logdir), purge_step=purge_step, filename_suffix=f".{self.run.role}"
        )

    def confirm(self, kind: str, step: int, key: str) -> bool | None:
        return None  # never asked: a record in doubt is written again after the purge step

    def kept_through(self) -> int | None:
        return None  # what it took, it keeps

    def log(self, record: Record) -> None:
        writer = self.writer
        if record.kind == "params":
            text = yaml.safe_dump(json.loads(json.dumps(record.params)), sort_keys=False)
            writer.add_text("spec", f"```yaml\n{text}```", 0, record.time)
        for key, value in record.metrics.items():
            writer.add_scalar(key, value, record.step, record.time)
        for key, words in record.text.items():
            writer.add_text(key, words, record.step, record.time)
        if record.image and Path(record.image).exists():
            writer.add_image(FIT_CURVE, _pixels(record.image), record.step, record.time, "HWC")
        writer.flush()

    def close(self, finished: bool) -> None:
        self.writer.close()


def _pixels(path: str) -> Any:
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))
