"""A restart resumes the data where it stopped: the prompts each step took (`data.logConsumed`,
consumed.jsonl) of runs killed with SIGKILL and resumed, against the rule of
scalerl.rollout.position: within an epoch no prompt is taken twice and none is skipped; what was
in flight at a kill is served again in its epoch.

The train set is cut to 24 prompts, so a run of a dozen steps goes through several epochs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_local import SMALL, finish, kill, running, wait_for_step

from scalerl.demo.assets import default_cache_dir, prepare_demo
from scalerl.runfile import run_command, write_variant
from scalerl.status.history import read_jsonl

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PROMPTS = 24


def small_train_set(tmp_path: Path) -> str:
    lines = prepare_demo(default_cache_dir()).train_path.read_text().splitlines()[:PROMPTS]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def spec(tmp_path: Path, name: str, *changes: dict) -> Path:
    """The demo, small, on 24 train prompts, recording what each step took; no curriculum, so
    every prompt stays in every epoch."""
    data = {"train": small_train_set(tmp_path), "logConsumed": True}
    base = {"data": data, "recipe": {"noPositiveResampling": {"enabled": False}}}
    return write_variant(EXAMPLES / "local.yaml", tmp_path / f"{name}.yaml", SMALL, base, *changes)


def batches(out: Path) -> list[dict]:
    rows = read_jsonl(out / "consumed.jsonl")
    assert [r["batch"] for r in rows] == list(range(len(rows)))  # each batch once, in order
    return rows


def taken(out: Path) -> list[tuple[str, int]]:
    return [(p["id"], p["epoch"]) for row in batches(out) for p in row["prompts"]]


PPO_1 = {"recipe": {"algorithm": "ppo-off-policy", "maxOffPolicySteps": 1}}
ONE_GENERATOR = {"generators": {"replicas": 1}}


@pytest.mark.slow
def test_a_killed_ppo_run_trains_on_the_same_prompts_step_for_step(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    done = subprocess.run(
        run_command(spec(tmp_path, "whole", PPO_1, ONE_GENERATOR), whole),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    killed = tmp_path / "killed"
    with running(spec(tmp_path, "killed", PPO_1, ONE_GENERATOR), killed) as proc:
        wait_for_step(killed, 5, proc, timeout_s=300)
        kill(killed, "trainer-0")  # the gang restarts from the step-4 checkpoint
        wait_for_step(killed, 9, proc, timeout_s=300)
        kill(killed, "generator-0")  # and from step 8
        output = finish(proc, timeout_s=400)
    assert "(2/3): generator-0 exited with code -9" in output
    expected = [sorted(p["id"] for p in row["prompts"]) for row in batches(whole)]
    got = [sorted(p["id"] for p in row["prompts"]) for row in batches(killed)]
    assert got == expected
    assert len(expected) == 12 and len(set(taken(whole))) == 12 * 8  # four epochs, none repeated


@pytest.mark.slow
def test_pipelinerl_restarts_and_a_reshard_take_each_prompt_once_per_epoch(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with running(spec(tmp_path, "two"), out) as proc:  # two generators
        wait_for_step(out, 5, proc, timeout_s=300)
        kill(out, "generator-1")
        wait_for_step(out, 9, proc, timeout_s=300)
        kill(out, "trainer-0")
        finish(proc, timeout_s=400)
    # Resumed with one generator: its shard is the whole train set.
    resumed = spec(tmp_path, "one", ONE_GENERATOR, {"budget": {"maxSteps": 18}})
    done = subprocess.run(run_command(resumed, out), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "logs" / "trainer-0.log").read_text().count("resumed from") == 3

    pairs = taken(out)
    assert len(pairs) == len(set(pairs)), "a prompt taken twice in one epoch"
    epochs: dict[str, list[int]] = {}
    for prompt, epoch in pairs:
        epochs.setdefault(prompt, []).append(epoch)
    assert len(epochs) == PROMPTS
    for prompt, seen in epochs.items():
        seen.sort()
        # Every epoch of every prompt up to its last, but for one group that may still have
        # been in flight when the run ended, while the same prompt's next epoch was taken.
        holes = sorted(set(range(seen[-1] + 1)) - set(seen))
        assert holes in ([], [seen[-1] - 1]), f"{prompt} skipped epochs {holes}: {seen}"
    counts = [len(seen) for seen in epochs.values()]
    assert max(counts) - min(counts) <= 1, epochs
    history = json.loads((out / "progress.json").read_text())
    assert history["step"] == 18
