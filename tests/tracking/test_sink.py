"""The sink's promises: across a kill and a resume every step reaches each tracker exactly once;
a tracker that is down neither slows the run nor stops it, and what it costs is counted."""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from tracker_readers import (
    mlflow_run,
    mlflow_series,
    tensorboard_events,
    tensorboard_series,
    wandb_history,
)

from scalerl.metrics import TrainerMetrics
from scalerl.spec import TrackingSpec
from scalerl.tracking import TrackedRun, TrackerSink, build_trackers
from scalerl.tracking.records import Delivered, Record

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
    and 7. MLflow was down the whole time (its store's folder a file), so attempt 1's steps reach
    it only from the journal, once attempt 2 finds it up; TensorBoard had all of attempt 1's and
    takes 6 and 7 again, its reader dropping the first copies (purge_step)."""
    store = tmp_path / "mlflow"  # a file until attempt 2: MLflow cannot make its database there
    store.write_text("")
    uri = f"sqlite:///{store}/mlflow.db"
    spec = TrackingSpec.model_validate({"mlflow": {"uri": uri}, "tensorboard": {}})
    run_dir = tmp_path / "run"

    first = open_sink(spec, run_dir, resume_step=0, backoff_s=(0.05, 0.1))
    first.evaluation(0, {"eval/pass_rate": 0.0})
    attempt(first, range(1, 8), evaluate_every=4, value=1000.0)
    first.close(timeout_s=2.0)  # the kill: what MLflow did not get stays in the journal
    # ... and nothing of attempt 1 runs any more, as after a kill: a delivery thread still in a
    # try when close gave up would otherwise open MLflow beside attempt 2 (two runs, once, on a
    # loaded machine).
    for delivery in first.deliveries:
        delivery.thread.join(timeout=60)
        assert not delivery.thread.is_alive()

    store.unlink()
    second = open_sink(spec, run_dir, resume_step=5, backoff_s=(0.05, 0.1))
    attempt(second, range(6, 11), evaluate_every=4, value=2000.0)
    second.close(finished=True, timeout_s=60)

    # Both: steps 1-5 as attempt 1 logged them, 6-10 as attempt 2 redid them, each once.
    expected = [*[(s, 1000.0 + s) for s in range(1, 6)], *[(s, 2000.0 + s) for s in range(6, 11)]]
    run = mlflow_run(uri, "scalerl", TrackedRun.of(NAME, "local", run_dir, "trainer").id)
    assert mlflow_series(uri, run, "train/reward") == expected
    assert [s for s, _ in mlflow_series(uri, run, "eval/pass_rate")] == [0, 4, 8]
    events = tensorboard_events(run_dir / "tensorboard" / NAME)
    assert tensorboard_series(events, "train/reward") == [
        (s, pytest.approx(v, rel=1e-6)) for s, v in expected
    ]
    assert [s for s, _ in tensorboard_series(events, "eval/pass_rate")] == [0, 4, 8]


def test_a_record_a_kill_left_in_doubt_is_neither_lost_nor_doubled(tmp_path: Path) -> None:
    """Killed after the trackers took step 5 but before the sink noted it, with the checkpoint at
    step 4: the next start asks MLflow whether it has step 5 (it has: the redone step 5 is not
    sent again), and TensorBoard writes the redone step 5 over its purge step."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    spec = TrackingSpec.model_validate({"mlflow": {"uri": uri}, "tensorboard": {}})
    run_dir = tmp_path / "run"
    first = open_sink(spec, run_dir, resume_step=0)
    attempt(first, range(1, 6), evaluate_every=100, value=1000.0)
    first.close(timeout_s=60)
    in_doubt = {"step": 4, "pending": {"kind": "step", "step": 5, "key": "train/reward"}}
    for tracker in ("mlflow", "tensorboard"):  # as the kill left them
        (run_dir / "tracking" / f"trainer-{tracker}.json").write_text(json.dumps(in_doubt))

    second = open_sink(spec, run_dir, resume_step=4)
    attempt(second, range(5, 9), evaluate_every=100, value=2000.0)
    second.close(timeout_s=60)

    before = [(s, 1000.0 + s) for s in range(1, 5)]
    run = mlflow_run(uri, "scalerl", TrackedRun.of(NAME, "local", run_dir, "trainer").id)
    assert mlflow_series(uri, run, "train/reward") == [
        *before,
        (5, 1005.0),
        *[(s, 2000.0 + s) for s in range(6, 9)],
    ]
    events = tensorboard_events(run_dir / "tensorboard" / NAME)
    assert tensorboard_series(events, "train/reward") == [
        (s, pytest.approx(v, rel=1e-6))
        for s, v in [*before, *[(s, 2000.0 + s) for s in range(5, 9)]]
    ]


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


def test_a_tracker_that_comes_back_gets_what_its_full_queue_left_on_disk(tmp_path: Path) -> None:
    """MLflow is down while 60 steps are logged into a queue of 5: 55 or so stay on disk only.
    Once it is back, its thread reads them from the journal: every step arrives once, in order."""
    store = tmp_path / "mlflow"
    store.write_text("")  # a file: MLflow cannot make its database there
    uri = f"sqlite:///{store}/mlflow.db"
    spec = TrackingSpec.model_validate({"mlflow": {"uri": uri}})
    sink = open_sink(
        spec, tmp_path / "run", resume_step=0, capacity=5, attempts=1000, backoff_s=(0.05, 0.05)
    )
    attempt(sink, range(1, 61), evaluate_every=1000, value=0.0)
    assert sink.dropped >= 50
    store.unlink()  # back
    sink.close(finished=True, timeout_s=120)

    run = mlflow_run(uri, "scalerl", TrackedRun.of(NAME, "local", tmp_path / "run", "trainer").id)
    assert mlflow_series(uri, run, "train/reward") == [(s, float(s)) for s in range(1, 61)]


# A trainer process's tracker sink, W&B offline, resumed at step RESUME (its checkpoint).
ATTEMPT = """
import json, os, signal, sys, time
from pathlib import Path
from scalerl.spec import TrackingSpec
from scalerl.tracking import TrackedRun, TrackerSink, build_trackers
from scalerl.tracking.records import Delivered, Record

run_dir = Path(sys.argv[1])
spec = TrackingSpec.model_validate({"wandb": {"mode": "offline"}})
run = TrackedRun.of("math-8b", "local", run_dir, "trainer")
sink = TrackerSink(build_trackers(spec, run), run, resume_step=RESUME)
"""

KILLED_ATTEMPT = (
    ATTEMPT.replace("RESUME", "0")
    + """
for step in range(1, 6):
    sink.step(step, {"train/reward": 1000.0 + step})
state = run_dir / "tracking" / "trainer-wandb.json"
while not (state.exists() and json.loads(state.read_text()).get("step") == 5):
    time.sleep(0.05)
os.kill(os.getpid(), signal.SIGKILL)  # W&B took steps 1-5 but has not written them yet
"""
)


def test_steps_w_and_b_took_but_a_kill_kept_from_its_files_are_sent_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILLED_ATTEMPT, str(run_dir)], timeout=120)
    assert killed.returncode == -signal.SIGKILL
    spec = TrackingSpec.model_validate({"wandb": {"mode": "offline"}})
    second = open_sink(spec, run_dir, resume_step=4)  # the checkpoint: step 4
    for step in range(5, 9):
        second.step(step, {"train/reward": 2000.0 + step})
    second.close(finished=True, timeout_s=60)

    run_id = TrackedRun.of(NAME, "local", run_dir, "trainer").id
    rows = [(r["_step"], r["train/reward"]) for r in wandb_history(run_dir, run_id)]
    # Every step once. Step 5, which the killed attempt took after its checkpoint, keeps the
    # value of whichever attempt W&B wrote first: the kill races W&B's own writer (on a loaded
    # machine it sometimes writes step 5 before the kill lands).
    assert [step for step, _ in rows] == list(range(1, 9))
    assert rows[:4] == [(s, 1000.0 + s) for s in range(1, 5)]
    assert rows[4][1] in (1005.0, 2005.0)
    assert rows[5:] == [(s, 2000.0 + s) for s in range(6, 9)]


RESUMED_ATTEMPT = (
    ATTEMPT.replace("RESUME", "4")
    + """
for step in range(5, 9):
    sink.step(step, {"train/reward": 2000.0 + step})
sink.close(finished=True, timeout_s=60)
"""
)


LAUNCHER = """
import os, subprocess, sys
import wandb

# A process that used W&B (a notebook, a launcher) starts the run's attempts.
wandb.init(mode="offline", dir=sys.argv[1], project="other").finish()
assert "WANDB_SERVICE" in os.environ
run_dir, killed, resumed = sys.argv[1] + "/run", sys.argv[2], sys.argv[3]
print(subprocess.run([sys.executable, "-c", killed, run_dir], timeout=120).returncode)
print(subprocess.run([sys.executable, "-c", resumed, run_dir], timeout=120).returncode)
"""


def test_a_trainer_started_by_a_process_that_used_w_and_b_writes_its_own_files(
    tmp_path: Path,
) -> None:
    # W&B names its service in WANDB_SERVICE for the children of a process that used it: a
    # trainer that joined it left its run open in a service that outlives it, and after a kill
    # the resumed attempt was refused ("run ID is in use") and its file never written.
    launcher = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tmp_path), KILLED_ATTEMPT, RESUMED_ATTEMPT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert launcher.stdout.split() == [str(-signal.SIGKILL), "0"], launcher.stderr

    run_id = TrackedRun.of(NAME, "local", tmp_path / "run", "trainer").id
    rows = [r["_step"] for r in wandb_history(tmp_path / "run", run_id)]
    assert rows == list(range(1, 9))


def test_a_tracker_that_kept_no_step_is_sent_the_params_again(tmp_path: Path) -> None:
    """trackio stores the params with its first record: a kill before that record was stored
    leaves the tracker without them, though it took them (kept_through -1)."""
    run = TrackedRun.of(NAME, "local", tmp_path, "trainer")
    run.folder.mkdir()  # the journal's folder, which the sink makes
    params, step = Record("params", 0, params={"model": {"path": "/m"}}), Record("step", 8)
    for kept, params_held in ((3, True), (-1, False)):
        delivered = Delivered(run, f"kept-{kept}")
        delivered.mark(params)
        delivered.mark(step)
        delivered.clamp(kept)
        assert delivered.has(params) is params_held
        assert not delivered.has(step) and delivered.has(Record("step", kept))
        assert Delivered(run, f"kept-{kept}").has(params) is params_held  # as saved
