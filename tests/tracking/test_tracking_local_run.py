"""End to end: `scalerl run` colocated (one process) with MLflow, TensorBoard and W&B offline
switched on, its process killed with SIGKILL mid-run and resumed from its checkpoint. Each
tracker, read by its own reader, holds every step of the run exactly once, the run's held-out
evaluations as history.jsonl has them, and the fit as fit.json has it.

The same run is the colocated PPO-off-policy kill-and-resume run (once
tests/test_local.py::test_colocated_ppo_off_policy_survives_a_kill_and_resumes, a run of its own):
chat-arith's byte-level BPE chat model, which does not think and has its EOS only in
generation_config.json, every batch once, no sample mixing policy versions."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from consumed import assert_once_per_epoch, batches
from test_local import alive
from tracker_readers import (
    mlflow_run,
    mlflow_series,
    tensorboard_events,
    tensorboard_series,
    wandb_history,
)

from scalerl.fit.report import FIT_FILE
from scalerl.runfile import run_command, write_variant
from scalerl.spec import evaluation_steps
from scalerl.status.history import read_history
from scalerl.tracking import TrackedRun

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 12
ROUND = 2  # PPO-off-policy-2: two batches from one policy, two steps, one hand-over
SMALL = {
    "placement": "colocated",
    "generators": {"replicas": 1},
    "trainers": {"replicas": 1},
    "recipe": {
        "algorithm": "ppo-off-policy",
        "maxOffPolicySteps": ROUND,
        "batch": {"prompts": 8, "generationsPerPrompt": 4},
    },
    "data": {"validation": {"prompts": 32}, "logConsumed": True},
    # Every 3 steps, a round evaluating at its end: steps 0, 4, 6, 10, 12, four evaluations past
    # step 0, as many as a fit needs.
    "evaluation": {"everySteps": 3, "generationsPerPrompt": 2},
    "budget": {"maxSteps": STEPS},
    "checkpoint": {"everySteps": 2},
    "fit": {"everyEvaluations": 2},
}
EVALUATED = [0, 4, 6, 10, 12]
# history.jsonl's train_* (the last batch before an evaluation) -> the tracker's name
TRAIN = {
    "train_pass_rate": "train/pass_rate",
    "train_entropy": "train/entropy",
    "train_loss": "train/loss",
    "train_grad_norm": "train/grad_norm",
    "train_clip_fraction": "train/clip_fraction",
}


def trainer_log(out: Path) -> str:
    return (out / "logs" / "trainer-0.log").read_text()


def wait_for_step(out: Path, step: int, proc: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if json.loads((out / "progress.json").read_text())["step"] >= step:
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"run did not reach step {step} within {timeout_s} s")


@pytest.mark.slow
def test_a_colocated_ppo_run_survives_a_kill_and_each_tracker_holds_every_step_once(
    tmp_path: Path,
) -> None:
    assert evaluation_steps(STEPS, 3, ROUND) == EVALUATED  # what the spec makes of the schedule
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = {
        "mlflow": {"uri": uri, "experiment": "demo"},
        "tensorboard": {},
        "wandb": {"project": "demo", "mode": "offline"},
    }
    spec = write_variant(
        EXAMPLES / "chat-arith.yaml", tmp_path / "run.yaml", SMALL, {"tracking": tracking}
    )
    out = tmp_path / "run"
    env = {**os.environ, "SCALERL_PEER_TIMEOUT": "120"}
    proc = subprocess.Popen(
        run_command(spec, out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,  # MLflow's SQLite store keeps artifacts in ./mlruns
    )
    try:
        wait_for_step(out, 5, proc, timeout_s=300)
        trainer = json.loads((out / "processes.json").read_text())["trainer-0"]
        reached = json.loads((out / "progress.json").read_text())["step"]
        # The whole run's one process: restarts from the step-4 (or -6) checkpoint.
        os.kill(trainer["pid"], signal.SIGKILL)
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    assert "restarting from the last checkpoint (1/3): trainer-0 exited with code -9" in output
    assert (out / FIT_FILE).exists(), output
    assert trainer_log(out).count("resumed from") == 1
    assert not alive(json.loads((out / "processes.json").read_text()))
    history = read_history(out / "history.jsonl")
    fit = json.loads((out / FIT_FILE).read_text())
    run_id = TrackedRun.of("chat-arith", "local", out, "trainer").id
    steps = list(range(1, STEPS + 1))
    evaluations = [(row["step"], row["pass_rate"]) for row in history]
    assert [s for s, _ in evaluations] == EVALUATED
    # Nothing is in flight when the weights change, so no sample mixes versions.
    assert history[-1]["counters"]["mixed_version_samples"] == 0
    assert history[-1]["counters"]["stale_groups"] == 0
    # Every batch once (the killed attempt's batches after its checkpoint are not in the record),
    # each of 8 prompts; a batch that updated nothing does not count as a step.
    rows_consumed = batches(out)
    assert len(rows_consumed) >= STEPS and {len(r["prompts"]) for r in rows_consumed} == {8}
    assert_once_per_epoch(out)
    # Steps the second attempt redid (after its checkpoint, up to where the first was killed, a
    # step later at most): MLflow and W&B keep the values first logged, as W&B's own resume does;
    # TensorBoard and history.jsonl have the redone ones.
    resumed = int(re.findall(r"resumed from .* \(step (\d+)\)", trainer_log(out))[0])
    redone = range(resumed + 1, reached + 2)
    kept = [row for row in history if row["step"] not in redone]
    trained = [row for row in history[1:] if row["train_loss"] is not None]  # updated

    mlflow = mlflow_run(uri, "demo", run_id)
    assert [s for s, _ in mlflow_series(uri, mlflow, "train/reward")] == steps
    assert [s for s, _ in mlflow_series(uri, mlflow, "eval/pass_rate")] == EVALUATED
    assert set(mlflow_series(uri, mlflow, "eval/pass_rate")) >= {
        (r["step"], r["pass_rate"]) for r in kept
    }
    assert mlflow_series(uri, mlflow, "fit/A")[-1] == (STEPS, fit["A"])
    assert mlflow_series(uri, mlflow, "fit/C_mid")[-1] == (STEPS, fit["C_mid"])
    for row in (r for r in trained if r["step"] not in redone):
        for key, name in TRAIN.items():
            assert dict(mlflow_series(uri, mlflow, name))[row["step"]] == row[key], name

    events = tensorboard_events(out / "tensorboard" / "chat-arith")
    assert [s for s, _ in tensorboard_series(events, "train/reward")] == steps
    assert tensorboard_series(events, "eval/pass_rate") == [
        (s, pytest.approx(v, rel=1e-6)) for s, v in evaluations
    ]
    for row in trained:  # every row, the redone ones included
        for key, name in TRAIN.items():
            value = dict(tensorboard_series(events, name))[row["step"]]
            assert value == pytest.approx(row[key], rel=1e-6), name

    # Train-inference mismatch apart from policy lag. PPO-off-policy-2: a round's first step
    # trains on samples of the version it holds (lag 0), its second on the version before (lag 1;
    # a step with nothing to learn shifts that). Engine and trainer compute in float32, so lag 0
    # is the engines' numeric mismatch alone; one update moves the policy far more.
    by_lag = {
        lag: dict(tensorboard_series(events, f"train/mismatch{suffix}/kl"))
        for lag, suffix in ((0, ""), (1, "_lag1"))
    }
    assert sorted(by_lag[0].keys() | by_lag[1].keys()) == steps  # every step, one lag each
    assert not by_lag[0].keys() & by_lag[1].keys() and 1 in by_lag[0] and by_lag[1]
    assert max(by_lag[0].values()) < 1e-6
    assert sorted(by_lag[1].values())[len(by_lag[1]) // 2] > 100 * max(by_lag[0].values())
    for row in trained:
        [(lag, figures)] = row["train_mismatch_by_lag"].items()
        assert by_lag[int(lag)][row["step"]] == pytest.approx(figures["kl"], rel=1e-6)

    rows: list[dict[str, Any]] = wandb_history(out, run_id)
    assert [r["_step"] for r in rows if "train/reward" in r] == steps
    logged = [(r["_step"], r["eval/pass_rate"]) for r in rows if "eval/pass_rate" in r]
    assert [s for s, _ in logged] == EVALUATED
    assert set(logged) >= {(r["step"], r["pass_rate"]) for r in kept}
    assert wandb_history(out, f"{run_id}-fit")[-1]["fit/A"] == fit["A"]
