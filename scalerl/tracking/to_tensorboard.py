"""TensorBoard (`spec.tracking.tensorboard`): event files written with tensorboardX's writer
(no TensorFlow, no torch), one folder per run: `<dir>/<run name>`, relative to the run directory.

Each process writes its own event file there (suffix: its role); TensorBoard reads the folder as
one run. Every record is flushed at once, so a killed process loses none it wrote.
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

    def __init__(self, spec: TensorboardTracking, run: TrackedRun) -> None:
        self.logdir = run.run_dir / spec.dir / run.name  # an absolute dir stays as it is
        self.run = run
        self.writer: Any = None

    def open(self) -> None:
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(str(self.logdir), filename_suffix=f".{self.run.role}")

    def log(self, record: Record) -> None:
        writer = self.writer
        if record.kind == "params":
            text = yaml.safe_dump(json.loads(json.dumps(record.params)), sort_keys=False)
            writer.add_text("spec", f"```yaml\n{text}```", 0, record.time)
        for key, value in record.metrics.items():
            writer.add_scalar(key, value, record.step, record.time)
        for key, value in record.text.items():
            writer.add_text(key, value, record.step, record.time)
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
