"""Each tracker's records as its own reader sees them: MLflow's `MlflowClient`, TensorBoard's
`EventAccumulator` (the `tensorboard` package, not the tensorboardX that wrote them), and W&B's
offline `.wandb` files parsed with W&B's own record protobuf.

W&B (0.31) ships no reader of offline runs; its files are LevelDB-style logs (a 7-byte header
":W&B", 0xBEE1, version; 32 KiB blocks of records: CRC32C (4), length (2, little-endian), type
(1: full, 2: first, 3: middle, 4: last), data), which `wandb_records` reads.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import wandb
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import (
    IMAGES,
    SCALARS,
    TENSORS,
    EventAccumulator,
)

from scalerl.tracking.to_mlflow import RUN_TAG
from scalerl.tracking.wandb_offline import offline_folders


def mlflow_run(uri: str, experiment: str, run_id: str) -> Any:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    runs = client.search_runs([found.experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{run_id}'")
    assert len(runs) == 1, f"{len(runs)} MLflow runs for {run_id}"
    return runs[0]


def mlflow_series(uri: str, run: Any, key: str) -> list[tuple[int, float]]:
    """(step, value) of every point of `key`, in step order (duplicates kept: they must not be)."""
    history = MlflowClient(uri).get_metric_history(run.info.run_id, key)
    return sorted((m.step, m.value) for m in history)


def tensorboard_events(logdir: Path) -> EventAccumulator:
    events = EventAccumulator(str(logdir), size_guidance={SCALARS: 0, IMAGES: 0, TENSORS: 0})
    events.Reload()
    return events


def tensorboard_series(events: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in events.Scalars(tag)]


BLOCK = 32 * 1024
HEADER = 7


def wandb_records(path: Path) -> list[Any]:
    """The records of one offline `run-<id>.wandb` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, path
    records, pending, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            break  # zero fill: the end of what was written
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_dir: Path, run_id: str) -> list[dict[str, Any]]:
    """Every history row of every offline folder of W&B run `run_id` in `run_dir`, in order
    (a resumed run adds a folder): `_step` and the logged keys, values decoded from JSON."""
    written()
    rows = []
    folders = offline_folders(run_dir, run_id)  # its naming: tests/tracking/test_wandb_offline
    assert folders, f"no offline W&B folder for {run_id} in {run_dir}"
    for folder in folders:
        for record in wandb_records(folder / f"run-{run_id}.wandb"):
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
    return rows


def written() -> None:
    """W&B's files as its writer leaves them. The writer is a service process of its own, and a
    run's finish() in this process can return before it has written the run's file (a CI run
    read none of a fit's rows); teardown() waits for the service to exit (a no-op where this
    process started none)."""
    wandb.teardown()


def wandb_config(run_dir: Path, run_id: str) -> dict[str, Any]:
    written()
    config: dict[str, Any] = {}
    for folder in offline_folders(run_dir, run_id):
        for record in wandb_records(folder / f"run-{run_id}.wandb"):
            kind = record.WhichOneof("record_type")
            items = record.config.update if kind == "config" else []
            if kind == "run":
                items = record.run.config.update
            for item in items:
                config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return config
