"""Weights & Biases (`spec.tracking.wandb`): `wandb.init` with the run's id and `resume="allow"`,
so every attempt of a run logs to the same W&B run. Offline mode writes `wandb/offline-run-*`
folders in the run directory (`wandb sync` uploads them). WANDB_API_KEY (and WANDB_BASE_URL for a
self-hosted server) come from the environment, read by wandb itself.

W&B keeps what `log` took only once its service has written it (every 15 s offline): a resumed
trainer sends again what the server (online) or the earlier offline files do not hold.

W&B lets one process at a time write a run, and the fit is made in another process than the
trainer's: the fits go to a second run, `<id>-fit`, in the same group (as prime-rl splits its
trainer and orchestrator runs).

Each process starts its own W&B service. W&B names a process's service in WANDB_SERVICE for its
children to join; one inherited from whatever started the run (a notebook, a launcher, pytest)
outlives our process, and after a kill it kept the run open ("run ID ... is in use"): the resumed
attempt could not log and its offline file was never written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import wandb

from scalerl.tracking.names import FIT_CURVE
from scalerl.tracking.records import Record, TrackedRun
from scalerl.tracking.wandb_offline import last_step

if TYPE_CHECKING:
    from scalerl.spec import WandbTracking

SERVICE_VARIABLE = "WANDB_SERVICE"


class WandbTracker:
    name = "wandb"
    rewrites = False

    def __init__(self, spec: WandbTracking, run: TrackedRun) -> None:
        self.spec, self.run = spec, run
        self.handle: Any = None
        self.kept = -1  # the last step an earlier attempt's offline files hold

    @property
    def run_id(self) -> str:
        return self.run.id if self.run.role == "trainer" else f"{self.run.id}-{self.run.role}"

    @property
    def run_name(self) -> str:
        return self.run.name if self.run.role == "trainer" else f"{self.run.name}-{self.run.role}"

    def confirm(self, kind: str, step: int, key: str) -> bool | None:
        return None  # no reading back here: a record in doubt counts as delivered

    def open(self, purge_step: int | None) -> None:
        if self.spec.mode == "offline":
            self.kept = last_step(self.run.run_dir, self.run_id)
        os.environ.pop(SERVICE_VARIABLE, None)  # an ancestor's service: see the module's doc
        self.handle = wandb.init(
            project=self.spec.project,
            entity=self.spec.entity,
            id=self.run_id,
            name=self.run_name,
            group=self.run.name,
            job_type=self.run.role,
            resume="allow",
            mode=self.spec.mode,
            dir=str(self.run.run_dir),
            settings=wandb.Settings(console="off", silent=True),
        )

    def kept_through(self) -> int | None:
        if self.spec.mode == "disabled":
            return None
        if self.spec.mode == "offline":
            return self.kept
        return int(self.handle.step) - 1  # a resumed run's next step is the server's last + 1

    def log(self, record: Record) -> None:
        if record.kind == "params":
            self.handle.config.update(record.params, allow_val_change=True)
            return
        data: dict[str, Any] = dict(record.metrics)
        if record.image and Path(record.image).exists():
            data[FIT_CURVE] = wandb.Image(record.image)
        for key, value in record.text.items():
            self.handle.summary[key] = value
        self.handle.log(data, step=record.step)

    def close(self, finished: bool) -> None:
        self.handle.finish(exit_code=0 if finished else 1)
