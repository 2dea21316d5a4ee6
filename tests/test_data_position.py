"""A restart resumes the data where it stopped: a PPO-off-policy-1 run on one generator, its
trainer killed with SIGKILL and resumed, trains on the prompts the run that never stopped
trained on, step for step. (tests/test_local.py checks the same rule under PipelineRL, with
kills, a different number of generators on resume, and colocated.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from consumed import assert_once_per_epoch, batches, small_train_set
from test_local import EXAMPLES, SMALL, finish, kill, running, wait_for_step

from scalerl.runfile import run_command, write_variant
from scalerl.status.history import read_scores

PPO_1 = {
    "recipe": {
        "algorithm": "ppo-off-policy",
        "maxOffPolicySteps": 1,
        "noPositiveResampling": {"enabled": False},
    },
    "generators": {"replicas": 1},
    "budget": {"maxSteps": 8},
    "evaluation": {"everySteps": 3},  # steps 0, 3, 6, 8: the fewest a spec allows (a fit's 4)
}


def spec(tmp_path: Path, name: str) -> Path:
    data = {"train": small_train_set(tmp_path), "logConsumed": True}
    return write_variant(
        EXAMPLES / "local.yaml", tmp_path / f"{name}.yaml", SMALL, PPO_1, {"data": data}
    )


@pytest.mark.slow
def test_a_killed_ppo_run_trains_on_the_same_prompts_step_for_step(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    done = subprocess.run(
        run_command(spec(tmp_path, "whole"), whole), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    killed = tmp_path / "killed"
    with running(spec(tmp_path, "killed"), killed) as proc:
        wait_for_step(killed, 3, proc, timeout_s=300)
        kill(killed, "trainer-0")  # the gang restarts from the step-2 checkpoint
        output = finish(proc, timeout_s=400)
    # (A generator's death is replaced alone, the data position kept: tests/test_local.py.)
    assert "(1/3): trainer-0 exited with code -9" in output
    expected = [sorted(p["id"] for p in row["prompts"]) for row in batches(whole)]
    got = [sorted(p["id"] for p in row["prompts"]) for row in batches(killed)]
    # Batch k is the k-th eight of the data order in both (a batch that updated nothing is one
    # more batch, not another order): at least the 8 steps' batches, the same.
    common = min(len(got), len(expected))
    assert common >= 8 and got[:common] == expected[:common]
    assert_once_per_epoch(whole)
    assert_once_per_epoch(killed)
    # The held-out evaluation samples from seeds of the run, the step and the prompt: the two
    # runs' step-0 evaluations (same weights) scored every prompt alike, sample for sample.
    assert read_scores(killed, 0) == read_scores(whole, 0)
