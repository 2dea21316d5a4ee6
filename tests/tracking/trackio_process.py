"""Run in the trackio venv (trackio_venv.py), with the source tree on PYTHONPATH: a process that
logs through scalerl.tracking to trackio, as a trainer or a fit does, or that reads back what
trackio stored with trackio's own API. TRACKIO_DIR names trackio's local store.

    python trackio_process.py log REQUEST.json     # steps (and a fit) through a TrackerSink
    python trackio_process.py read PROJECT         # every run's logs and config, JSON on stdout

A log request: {"run_dir", "role", "resume_step", "params", "steps": [[step, {metrics}], ...],
"evaluations": [[step, {metrics}], ...],
"fit": [step, {metrics}, {text}, image] or null, "kill_once_taken": step or null}. With
kill_once_taken, the process kills itself with SIGKILL as soon as trackio has taken that step from
the sink (trackio writes to its store from a background thread: what it took is not yet all
stored), as a trainer killed mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from scalerl.spec import TrackingSpec
from scalerl.tracking import TrackedRun, TrackerSink, build_trackers
from scalerl.tracking.records import Record

PROJECT = "scalerl-tests"
RUN = "math-8b"


def log(request: dict[str, Any]) -> None:
    spec = TrackingSpec.model_validate({"trackio": {"project": PROJECT}})
    run = TrackedRun.of(RUN, "local", Path(request["run_dir"]), request["role"])
    sink = TrackerSink(build_trackers(spec, run), run, resume_step=request["resume_step"])
    if request.get("params"):
        sink.params(request["params"])
    for step, metrics in request["steps"]:
        sink.step(step, metrics)
    for step, metrics in request.get("evaluations", []):
        sink.evaluation(step, metrics)
    if request.get("fit"):
        sink.fit(*request["fit"])
    if request.get("kill_once_taken") is not None:
        wait_until_taken(sink, request["kill_once_taken"])
        os.kill(os.getpid(), signal.SIGKILL)
    sink.close(finished=True, timeout_s=60)


def wait_until_taken(sink: TrackerSink, step: int) -> None:
    (delivery,) = sink.deliveries
    deadline = time.monotonic() + 60
    while not delivery.delivered.has(Record("step", step)):
        if time.monotonic() > deadline:
            raise SystemExit(f"trackio did not take step {step} within 60 s")
        time.sleep(0.001)


def read(project: str) -> dict[str, Any]:
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    if not SQLiteStorage.get_project_db_path(project).exists():
        return {}  # nothing stored yet: trackio makes the project with its first record
    runs: dict[str, Any] = {}
    for run in trackio.Api().runs(project):
        logs = SQLiteStorage.get_logs(project, run.name, run_id=run.id)
        runs[run.name] = {"config": run.config, "logs": logs}
    return runs


if __name__ == "__main__":
    if sys.argv[1] == "log":
        log(json.loads(Path(sys.argv[2]).read_text()))
    else:
        print(json.dumps(read(sys.argv[2]), default=str))
