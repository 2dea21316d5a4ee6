"""The sink's promises: across a kill and a resume every step reaches each tracker exactly once;
a tracker that is down neither slows the run nor stops it, and what it costs is counted."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from tracker_readers import mlflow_run, mlflow_series, tensorboard_events, tensorboard_series

from scalerl.metrics import TrainerMetrics
from scalerl.spec import TrackingSpec
from scalerl.tracking import TrackedRun, TrackerSink, build_trackers

NAME = "math-8b"


def open_sink(spec: TrackingSpec, run_dir: Path, resume_step: int, **options: Any) -> TrackerSink:
    run = TrackedRun.of(NAME, "local", run_dir, "trainer")
    return TrackerSink(build_trackers(spec, run), run, resume_step=resume_step, **options)


def attempt(sink: TrackerSink, steps: range, evaluate_every: int, value: float) -> None:
    """What a trainer logs over `steps`: each step, and an evaluation every few."""
    for step in steps:
        sink.step(step, {"train/reward": value + step})
        if step % evaluate_every == 0:
            sink.evaluation(step, {"eval/pass_rate": value + step / 100})


def test_a_kill_and_resume_logs_every_step_exactly_once(tmp_path: Path) -> None:
    """Attempt 1 trains to step 7 and dies; its checkpoint is at step 5, so attempt 2 redoes 6
    and 7. TensorBoard had everything of attempt 1; MLflow was down the whole time (its store's
    folder a file), so attempt 1's steps reach it only from the journal, when attempt 2 finds
    it up."""
    store = tmp_path / "mlflow"  # a file until attempt 2: MLflow cannot make its database there
    store.write_text("")
    uri = f"sqlite:///{store}/mlflow.db"
    spec = TrackingSpec.model_validate({"mlflow": {"uri": uri}, "tensorboard": {}})
    run_dir = tmp_path / "run"

    first = open_sink(spec, run_dir, resume_step=0, backoff_s=(0.05, 0.1))
    first.evaluation(0, {"eval/pass_rate": 0.0})
    attempt(first, range(1, 8), evaluate_every=4, value=1000.0)
    first.close(timeout_s=2.0)  # the kill: what MLflow did not get stays in the journal

    store.unlink()
    second = open_sink(spec, run_dir, resume_step=5, backoff_s=(0.05, 0.1))
    attempt(second, range(6, 11), evaluate_every=4, value=2000.0)
    second.close(finished=True, timeout_s=60)

    run = mlflow_run(uri, "scalerl", TrackedRun.of(NAME, "local", run_dir, "trainer").id)
    # MLflow: steps 1-5 from attempt 1 (sent from the journal), 6-10 as attempt 2 redid them.
    assert mlflow_series(uri, run, "train/reward") == [
        *[(s, 1000.0 + s) for s in range(1, 6)],
        *[(s, 2000.0 + s) for s in range(6, 11)],
    ]
    assert [s for s, _ in mlflow_series(uri, run, "eval/pass_rate")] == [0, 4, 8]
    # TensorBoard had 6 and 7 from attempt 1: they stand, and are not written twice.
    events = tensorboard_events(run_dir / "tensorboard" / NAME)
    assert [s for s, _ in tensorboard_series(events, "train/reward")] == list(range(1, 11))
    assert [s for s, _ in tensorboard_series(events, "eval/pass_rate")] == [0, 4, 8]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def test_a_tracker_that_is_down_costs_the_run_no_time_and_is_counted(
    tmp_path: Path, caplog: object
) -> None:
    uri = f"http://127.0.0.1:{closed_port()}"
    spec = TrackingSpec.model_validate({"mlflow": {"uri": uri}})
    metrics = TrainerMetrics("ns", NAME)
    sink = open_sink(
        spec,
        tmp_path / "run",
        resume_step=0,
        on_dropped=metrics.tracker_dropped_records.inc,
        on_failed=metrics.tracker_failed_records.inc,
        capacity=100,
        attempts=2,
        backoff_s=(0.05, 0.05),
    )
    with caplog.at_level(logging.WARNING, logger="scalerl.tracking"):  # type: ignore[attr-defined]
        started = time.perf_counter()
        attempt(sink, range(1, 2001), evaluate_every=100, value=0.0)
        logging_s = time.perf_counter() - started
        started = time.perf_counter()
        sink.close(timeout_s=1.0)
        closing_s = time.perf_counter() - started
    # 2020 records in well under a second: each is a line in the journal and a queue put.
    assert logging_s < 1.0, logging_s
    assert closing_s < 1.5, closing_s
    exported = generate_latest(metrics.registry).decode()
    dropped = _counter(exported, "scalerl_tracker_dropped_records_total")
    failed = _counter(exported, "scalerl_tracker_failed_records_total")
    assert dropped == sink.dropped >= 2020 - 100 - 10  # the queue held 100; a few were taken
    assert failed >= 1
    text = caplog.text  # type: ignore[attr-defined]
    assert "tracker mlflow:" in text and "training goes on" in text
    assert "tracker mlflow is behind" in text
    # Nothing is lost: the journal holds every record for the next start.
    assert len((tmp_path / "run" / "tracking" / "trainer.jsonl").read_text().splitlines()) == 2020


def _counter(exported: str, name: str) -> float:
    lines = [line for line in exported.splitlines() if line.startswith(name + "{")]
    assert len(lines) == 1, exported
    return float(lines[0].rsplit(" ", 1)[1])
