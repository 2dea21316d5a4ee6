"""The generator process: an unreachable trainer or a missing model is reported clearly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from scalerl.demo.model import build_random_model
from scalerl.environment import ProcessEnv
from scalerl.ports import free_port


def generator_env(tmp_path: Path, model: Path) -> ProcessEnv:
    train = tmp_path / "train.jsonl"
    train.write_text('{"prompt": "ab>", "answer": "ba"}\n' * 8)
    spec = tmp_path / "run.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "scalerl.dev/v1alpha1",
                "kind": "ScaleRLRun",
                "metadata": {"name": "t"},
                "spec": {
                    "model": {"path": str(model)},
                    "data": {"train": str(train), "validation": {"prompts": 2}, "reward": "exact"},
                    # Budgets that fit the tiny model's 512 positions (checked before the trainer
                    # is contacted).
                    "recipe": {
                        "length": {
                            "maxPromptTokens": 16,
                            "thinkingBudget": 16,
                            "answerBudget": 16,
                            "interruption": {"window": [12, 16]},
                        }
                    },
                    "generators": {"replicas": 1, "gpus": 0},
                },
            }
        )
    )
    return ProcessEnv(
        spec=spec,
        run_dir=tmp_path / "run",
        trainer_host="127.0.0.1",
        channel_port=free_port(),
        sync_port=free_port(),
        metrics_port=free_port(),
        compute_units=2,
        generator_index=0,
        peer_timeout_s=2.0,
        startup_timeout_s=2.0,  # how long the first meeting waits for the trainer
    )


COMMAND = [sys.executable, "-m", "scalerl.cli", "generator"]


def run_generator(tmp_path: Path, model: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    env = generator_env(tmp_path, model)
    result = subprocess.run(
        COMMAND,
        env=env.to_environ() | {"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, env.channel_port


@pytest.mark.slow  # waits out the startup timeout
def test_generator_reports_an_unreachable_trainer(tmp_path: Path) -> None:
    result, port = run_generator(tmp_path, build_random_model(tmp_path / "model"))
    assert result.returncode == 1
    assert f"trainer at tcp://127.0.0.1:{port} not reachable for 2 s" in result.stderr
    assert "Traceback" not in result.stderr


def test_generator_reports_a_missing_model_directory(tmp_path: Path) -> None:
    result, _ = run_generator(tmp_path, tmp_path / "nowhere")
    assert result.returncode == 2
    missing = f"spec.model.path: {tmp_path / 'nowhere'} does not exist"
    assert f"{missing}; it must be a Hugging Face model directory" in result.stderr
    assert "Traceback" not in result.stderr


def test_sigterm_while_the_engine_is_built_stops_the_generator_there(tmp_path: Path) -> None:
    """A replacement still starting when its run ends (or a pod deleted while it starts) stops at
    once, not once its engine is up: the runner would otherwise wait out its stop grace."""
    env = generator_env(tmp_path, build_random_model(tmp_path / "model"))
    proc = subprocess.Popen(
        COMMAND,
        env=env.to_environ() | {"PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        metrics = f"http://127.0.0.1:{env.metrics_port}/metrics"
        deadline = time.monotonic() + 60
        while not answers(metrics):  # serving /metrics: the engine's build (vLLM's import) next
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, output  # stopped, not done: a pod fails
    assert "generator 0 stopped (SIGTERM)" in output
    assert "Initializing a V1 LLM engine" not in output  # stopped before its engine was made
    assert "Traceback" not in output


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False
