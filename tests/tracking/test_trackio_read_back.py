"""trackio, read back by trackio's own API from its local store: a trainer killed with SIGKILL
while records were in flight and resumed from its checkpoint, then a fit, each a process that logs
through scalerl.tracking's trackio adapter. trackio runs in a venv of its own (trackio_venv.py):
it pins pillow below 13, which this project's venv cannot have."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trackio_venv import trackio_python

from scalerl.fit.law import sigmoid
from scalerl.fit.report import FIT_FILE, PLOT_FILE, write_fit
from scalerl.spec import BudgetSpec
from scalerl.tracking import TrackedRun, names

ROOT = Path(__file__).resolve().parents[2]
PROCESS = Path(__file__).with_name("trackio_process.py")
SPEC = {"model": {"path": "/models/base"}, "recipe": {"optimizer": {"lr": 5e-7}}}


@pytest.fixture(scope="module")
def python() -> Path:
    found = trackio_python()  # made by `make trackio-venv` (24 s cold), cached in ~/.cache/scalerl
    if not found.exists():
        message = f"no trackio venv at {found}: run make trackio-venv"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def run(python: Path, store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACKIO_DIR": str(store)}
    env.pop("SCALERL_RUN_UID", None)
    return subprocess.run(
        [str(python), str(PROCESS), *args], env=env, capture_output=True, text=True, timeout=180
    )


def log(python: Path, store: Path, tmp_path: Path, **request: Any) -> int:
    path = tmp_path / "request.json"
    path.write_text(json.dumps({"run_dir": str(tmp_path / "run"), **request}))
    done = run(python, store, "log", str(path))
    assert done.returncode in (0, -9), done.stderr
    return done.returncode


def read(python: Path, store: Path) -> dict[str, Any]:
    """Each run's logs and config, as trackio's own API reads its store."""
    done = run(python, store, "read", "scalerl-tests")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def reward(step: int, attempt: int) -> float:
    return step / 16 + attempt  # each attempt's values differ: which one was kept shows


def curve(points: int = 10) -> list[dict[str, float]]:
    compute = np.linspace(0.0, 40.0, points)
    rate = sigmoid(compute, A=0.7, B=1.5, C_mid=20.0, R0=0.1)
    noise = 0.005 * np.sin(np.arange(points))
    return [
        {"step": 10 * i, "compute": float(c), "pass_rate": float(r + e), "pass_rate_se": 0.01}
        for i, (c, r, e) in enumerate(zip(compute, rate, noise, strict=True))
    ]


def test_trackio_holds_every_step_once_across_a_kill_and_the_fit(
    python: Path, tmp_path: Path
) -> None:
    store = tmp_path / "trackio"
    # trackio's run: the ScaleRLRun's name and the start of its id (locally, of its directory)
    trainer_run = f"math-8b-{TrackedRun.of('math-8b', 'local', tmp_path / 'run', 'trainer').id[:8]}"
    first = [[s, {"train/reward": reward(s, 0)}] for s in range(1, 9)]
    killed = log(
        python, store, tmp_path, role="trainer", resume_step=0, params=SPEC, steps=first,
        evaluations=[[0, {"eval/pass_rate": 0.1}]], kill_once_taken=8,
    )  # fmt: skip
    assert killed == -9  # SIGKILL, the last steps perhaps not yet in trackio's store
    stored = read(python, store).get(trainer_run, {"logs": []})["logs"]
    kept = {row["step"] for row in stored if "train/reward" in row}
    # The restart resumes from the step-2 checkpoint and redoes steps 3..8, then goes on to 12.
    second = [[s, {"train/reward": reward(s, 1)}] for s in range(3, 13)]
    evaluations = [[6, {"eval/pass_rate": 0.3}], [12, {"eval/pass_rate": 0.5}]]
    log(python, store, tmp_path, role="trainer", resume_step=2, steps=second,
        evaluations=evaluations)  # fmt: skip
    run_dir = tmp_path / "run"
    report = write_fit(curve(), run_dir, min_compute=0.0, budget=BudgetSpec(), units=1)
    fit = [12, names.fit_metrics(report), names.fit_text(report), str(run_dir / PLOT_FILE)]
    log(python, store, tmp_path, role="fit", resume_step=None, steps=[], fit=fit)

    runs = read(python, store)
    assert sorted(runs) == [trainer_run, f"{trainer_run}-fit"]

    trainer = runs[trainer_run]["logs"]
    rewards = [(row["step"], row["train/reward"]) for row in trainer if "train/reward" in row]
    assert [s for s, _ in rewards] == list(range(1, 13))  # every step, exactly once
    # Up to the checkpoint (step 2) the first attempt's values, from the journal; after it, what
    # trackio had stored when the first attempt was killed keeps that attempt's values (as W&B's
    # resume does), and the steps it had taken but not stored are the second attempt's.
    first_kept = {1, 2} | kept
    assert rewards == [(s, reward(s, 0 if s in first_kept else 1)) for s in range(1, 13)]
    stored = [(row["step"], row["eval/pass_rate"]) for row in trainer if "eval/pass_rate" in row]
    assert stored == [(0, 0.1), (6, 0.3), (12, 0.5)]
    config = runs[trainer_run]["config"]
    assert config["model"] == {"path": "/models/base"}
    assert config["recipe"]["optimizer"]["lr"] == 5e-7

    written = json.loads((run_dir / FIT_FILE).read_text())
    (row,) = runs[f"{trainer_run}-fit"]["logs"]
    assert row["step"] == 12
    assert row["fit/A"] == written["A"]
    assert (row["fit/A_low"], row["fit/A_high"]) == tuple(written["A_interval"])
    assert row["fit/C_mid"] == written["C_mid"]
    assert row["fit/predicted_at_budget"] == written["predictedAtBudget"]
    assert row[names.FIT_CURVE]["_type"] == "trackio.image"
    assert (store / "media").exists()
