"""End to end on a model that is not the demo's: `examples/chat-arith.yaml` through `scalerl run`
(a byte-level BPE chat model without thinking, its EOS only in generation_config.json, Parquet data
with its own field names) must raise the held-out pass rate well above the warmed-up base, with
every weight trained and with a LoRA adapter."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from scalerl.demo.arith import SYSTEM_PROMPT
from scalerl.runfile import write_variant
from scalerl.status.history import read_history

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "chat-arith.yaml"
# Measured on 2 cores: the base is at ~0.2 and the example's run ends near ~0.6; a rise of at
# least this much cannot come from evaluation noise (128 prompts x 4 samples: sd ~0.03).
MIN_RISE = 0.15
TIMEOUT_S = 900


def test_the_example_uses_the_system_prompt_the_model_was_warmed_up_with() -> None:
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    assert spec["data"]["systemPrompt"] == SYSTEM_PROMPT


def run_to_the_end(spec: Path, out: Path) -> list[dict[str, Any]]:
    """`scalerl run` of `spec` into `out`, to its budget; the held-out evaluations it recorded."""
    env = {**os.environ, "SCALERL_PEER_TIMEOUT": "120"}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "scalerl.cli", "run", str(spec), "--out", str(out)]
        + ["--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
    )
    wall = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    history = read_history(out / "history.jsonl")
    curve = [(e["step"], round(e["pass_rate"], 3)) for e in history]
    print(f"{spec.name}: {wall:.0f} s, held-out pass rate by step {curve}")
    assert history[0]["step"] == 0
    return history


def assert_learnt(history: list[dict[str, Any]]) -> None:
    start, best_late = history[0]["pass_rate"], max(e["pass_rate"] for e in history[-2:])
    assert best_late >= start + MIN_RISE, [(e["step"], e["pass_rate"]) for e in history]


@pytest.mark.slow
def test_chat_arith_learns_through_scalerl_run(tmp_path: Path) -> None:
    assert_learnt(run_to_the_end(EXAMPLE, tmp_path / "run"))


@pytest.mark.slow
def test_chat_arith_learns_a_lora_adapter_off_policy(tmp_path: Path) -> None:
    # The example's two processes with a rank-16 adapter at LoRA's learning rate, under
    # PPO-off-policy-2: each version is the adapter alone, broadcast to the generator's engine.
    lora = {
        "model": {"lora": {"rank": 16, "alpha": 32}},
        "recipe": {
            "algorithm": "ppo-off-policy",
            "maxOffPolicySteps": 2,
            "optimizer": {"lr": 1.0e-3},
        },
        "budget": {"maxSteps": 40},
        "checkpoint": {"everySteps": 40},
    }
    spec = write_variant(EXAMPLE, tmp_path / "lora.yaml", lora)
    history = run_to_the_end(spec, tmp_path / "run")
    assert [e["step"] for e in history] == [0, 10, 20, 30, 40]
    assert_learnt(history)
    # Its checkpoints are the adapter (PEFT's folder), not the model.
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000040"
    assert (checkpoint / "adapter_config.json").is_file()
    assert not (checkpoint / "model.safetensors").exists()
