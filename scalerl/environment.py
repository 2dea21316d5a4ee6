"""The environment contract of every process: what a pod (or the local runner) tells a trainer or
generator through environment variables.

The operator's manifest builders and the local runner both produce it with `ProcessEnv.to_environ`,
and the processes read it with `ProcessEnv.from_environ`, so the two sides cannot drift.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from scalerl.errors import InputError

_PREFIX = "SCALERL_"
_JOB_INDEX = "JOB_COMPLETION_INDEX"  # set by Kubernetes in every pod of an Indexed Job
# Set by torchrun in each of the ranks it starts in a trainer pod with several GPUs.
_LOCAL_RANK, _LOCAL_RANKS = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
# spec.environment.openenv's server (http://host:port), for the processes that run rollouts: set
# by the local runner (the server it started) and the operator (the run's `<run>-env` Service).
OPENENV_URL_VAR = _PREFIX + "OPENENV_URL"
LOG_LEVEL_VAR = _PREFIX + "LOG"  # the processes' log level (INFO)


def configure_logging() -> None:
    """Every process logs each line with its time: a restart, a slow start or a peer's timeout
    reads off the logs of the gang side by side."""
    logging.basicConfig(
        level=os.environ.get(LOG_LEVEL_VAR, "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def exit_now(code: int) -> NoReturn:
    """End a process whose work is done and saved: flush what it wrote, then exit without the
    interpreter's teardown (with torch and vLLM loaded, seconds of module and garbage clean-up
    that a gang's stop and restart would wait for)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@dataclass(frozen=True)
class ProcessEnv:
    spec: Path  # the ScaleRLRun YAML (a ConfigMap mount in the cluster)
    run_dir: Path  # checkpoints and history (the checkpoint volume in the cluster)
    trainer_host: str  # trainer 0: the headless Service's DNS name, or 127.0.0.1 locally
    channel_port: int  # ZeroMQ rollouts up / commands down, bound by trainer 0
    sync_port: int  # TCPStore of the weight-sync group, at trainer 0
    metrics_port: int  # this process's /metrics (0 = not served)
    compute_units: int  # GPUs of the whole run (processes locally): compute = wall hours x this
    # This generator's index; -1 in the trainer. Unset in the environment, it is the pod's index
    # in its Indexed Job (JOB_COMPLETION_INDEX): one pod template serves every generator.
    generator_index: int = -1
    peer_timeout_s: float = 300.0  # how long to wait for a silent peer before failing
    # How long to wait for the peers to meet the first time: on a cluster, the run's startup
    # timeout (their pods may start minutes apart: scheduling, image pulls), which the operator
    # enforces on the gang as a whole.
    startup_timeout_s: float = 300.0
    status: str = "files"  # the status sink: files in run_dir, or kubernetes:<namespace>/<name>
    # Where this process listens (rollout stream, sync store, /metrics): loopback by default, so a
    # local run is not open to its network; "0.0.0.0" in pods, behind the run's NetworkPolicy.
    bind_host: str = "127.0.0.1"
    # The rollout stream's CURVE keys (scalerl.rollout.keys); None: an unauthenticated stream.
    stream_keys: Path | None = None
    # Trainer ranks (scalerl.trainer.shard): this trainer's rank, how many there are, and the port
    # of their own process group's store at trainer 0 (0 with a single rank). Unset in the
    # environment, the rank is the pod's index in the trainers' Indexed Job times the ranks per
    # pod, plus torchrun's LOCAL_RANK in a pod with several GPUs.
    trainer_rank: int = 0
    trainer_ranks: int = 1
    ranks_port: int = 0
    # This rank's place on its machine (torchrun's LOCAL_RANK): the GPU it trains on.
    trainer_local_rank: int = 0

    def to_environ(self) -> dict[str, str]:
        return {
            _PREFIX + "SPEC": str(self.spec),
            _PREFIX + "RUN_DIR": str(self.run_dir),
            _PREFIX + "TRAINER_HOST": self.trainer_host,
            _PREFIX + "CHANNEL_PORT": str(self.channel_port),
            _PREFIX + "SYNC_PORT": str(self.sync_port),
            _PREFIX + "METRICS_PORT": str(self.metrics_port),
            _PREFIX + "COMPUTE_UNITS": str(self.compute_units),
            _PREFIX + "GENERATOR_INDEX": str(self.generator_index),
            _PREFIX + "PEER_TIMEOUT": str(self.peer_timeout_s),
            _PREFIX + "STARTUP_TIMEOUT": str(self.startup_timeout_s),
            _PREFIX + "STATUS": self.status,
            _PREFIX + "BIND_HOST": self.bind_host,
            _PREFIX + "STREAM_KEYS": str(self.stream_keys or ""),
            _PREFIX + "TRAINER_RANK": str(self.trainer_rank),
            _PREFIX + "TRAINER_RANKS": str(self.trainer_ranks),
            _PREFIX + "RANKS_PORT": str(self.ranks_port),
            _LOCAL_RANK: str(self.trainer_local_rank),
        }

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ProcessEnv:
        environ = os.environ if environ is None else environ

        def get(name: str, default: str | None = None) -> str:
            value = environ.get(_PREFIX + name, default)
            if value is None:
                raise InputError(f"environment variable {_PREFIX}{name} is not set")
            return value

        def integer(name: str, default: str | None = None, prefix: str = _PREFIX) -> int:
            raw = get(name, default) if prefix else environ.get(name, default)
            try:
                return int(raw)  # type: ignore[arg-type]
            except ValueError:
                raise InputError(f"{prefix}{name}={raw!r} is not an integer") from None

        # Several ranks in one pod (one per GPU) are started by torchrun, which numbers them.
        local_rank = integer(_LOCAL_RANK, "0", prefix="")
        torchrun = _LOCAL_RANKS in environ
        pod_rank = integer(_JOB_INDEX, "0", prefix="") * integer(_LOCAL_RANKS, "1", prefix="")

        return cls(
            spec=Path(get("SPEC")),
            run_dir=Path(get("RUN_DIR")),
            trainer_host=get("TRAINER_HOST", "127.0.0.1"),
            channel_port=integer("CHANNEL_PORT"),
            sync_port=integer("SYNC_PORT"),
            # A pod has one metrics port: of the ranks torchrun starts in it, the first serves it.
            metrics_port=integer("METRICS_PORT", "0") if local_rank == 0 or not torchrun else 0,
            compute_units=integer("COMPUTE_UNITS", "1"),
            generator_index=integer("GENERATOR_INDEX", environ.get(_JOB_INDEX, "-1")),
            peer_timeout_s=float(get("PEER_TIMEOUT", "300")),
            startup_timeout_s=float(get("STARTUP_TIMEOUT", get("PEER_TIMEOUT", "300"))),
            status=get("STATUS", "files"),
            bind_host=get("BIND_HOST", "127.0.0.1"),
            stream_keys=Path(keys) if (keys := get("STREAM_KEYS", "")) else None,
            trainer_rank=integer("TRAINER_RANK", str(pod_rank + local_rank)),
            trainer_ranks=integer("TRAINER_RANKS", "1"),
            ranks_port=integer("RANKS_PORT", "0"),
            trainer_local_rank=local_rank,
        )
