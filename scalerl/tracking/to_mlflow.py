"""MLflow (`spec.tracking.mlflow`), through `MlflowClient` of mlflow-skinny: the client alone.

MLflow picks run ids itself, so the run's identity is a tag (`scalerl.run`): every process and
attempt finds the run by it, and creates it only when there is none. Metric points are logged
with the record's own time, so delivering a record again adds nothing: MLflow keeps one point per
(key, step, time, value). Credentials: MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME and
MLFLOW_TRACKING_PASSWORD, read by MLflow itself from the environment.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# MLflow's own HTTP retries would hold a delivery thread for minutes against a server that is
# down; the sink retries with its own backoff instead. A user's setting wins.
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")

from mlflow import MlflowClient  # noqa: E402 — after the settings above
from mlflow.entities import Metric, Param, RunTag  # noqa: E402

from scalerl.errors import InputError  # noqa: E402
from scalerl.tracking.names import flatten  # noqa: E402
from scalerl.tracking.records import Record, TrackedRun  # noqa: E402

if TYPE_CHECKING:
    from scalerl.spec import MlflowTracking

RUN_TAG = "scalerl.run"  # the ScaleRLRun's identity (TrackedRun.id)
BATCH = 100  # MLflow takes at most 100 parameters per log_batch call
MAX_PARAM = 6000  # characters of one parameter value MLflow stores


class MlflowTracker:
    name = "mlflow"
    rewrites = False

    def __init__(self, spec: MlflowTracking, run: TrackedRun) -> None:
        uri = spec.uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise InputError("spec.tracking.mlflow: no uri, and MLFLOW_TRACKING_URI is not set")
        self.uri, self.experiment, self.run = uri, spec.experiment, run
        self.client: MlflowClient | None = None
        self.run_id = ""

    def open(self, purge_step: int | None) -> None:
        client = MlflowClient(self.uri)
        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None:
            experiment_id = client.create_experiment(self.experiment)
        else:
            experiment_id = experiment.experiment_id
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_TAG}` = '{self.run.id}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
        else:
            tags = {RUN_TAG: self.run.id, "scalerl.namespace": self.run.namespace}
            self.run_id = client.create_run(
                experiment_id, tags=tags, run_name=self.run.name
            ).info.run_id
        self.client = client

    def confirm(self, kind: str, step: int, key: str) -> bool | None:
        if self.client is None or not key:
            return None
        return any(m.step == step for m in self.client.get_metric_history(self.run_id, key))

    def kept_through(self) -> int | None:
        return None  # what it took, it keeps

    def log(self, record: Record) -> None:
        assert self.client is not None  # opened by the delivery thread first
        if record.kind == "params":
            params = [Param(k, v[:MAX_PARAM]) for k, v in flatten(record.params).items()]
            for i in range(0, len(params), BATCH):
                self.client.log_batch(self.run_id, params=params[i : i + BATCH])
            return
        millis = int(record.time * 1000)
        metrics = [Metric(k, v, millis, record.step) for k, v in record.metrics.items()]
        tags = [RunTag(k, v) for k, v in record.text.items()]
        self.client.log_batch(self.run_id, metrics=metrics, tags=tags)
        if record.image and os.path.exists(record.image):
            self.client.log_artifact(self.run_id, record.image, "fit")

    def close(self, finished: bool) -> None:
        if finished and self.client is not None and self.run.role == "trainer":
            self.client.set_terminated(self.run_id, "FINISHED")
