"""Whole runs with an environment, as `scalerl run examples/tool-env.yaml` makes them.

The tool task is learnt (the model calls the calculator more and passes more), and a generator
killed mid-conversation is replaced alone, without a conversation half-trained and with the data
position exact; a ToolEnv and a MultiTurnEnv train in both placements and with both algorithms.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from consumed import assert_once_per_epoch
from editable import install_editable
from test_local import EXAMPLES, finish, kill, running, wait_for_step

from scalerl.runfile import write_variant
from scalerl.status.history import read_jsonl

pytestmark = pytest.mark.slow

TOOL_RUN = {
    "environment": {"verifiers": {"args": {"num_train": 400, "num_eval": 48, "max_turns": 3}}},
    "data": {"validation": {"prompts": 48}, "logConsumed": True},
    "evaluation": {"everySteps": 4, "generationsPerPrompt": 4, "logCompletions": 4},
    "budget": {"maxSteps": 16},
    "checkpoint": {"everySteps": 4},
}


def test_tool_use_is_learnt_and_survives_a_generator_killed_mid_conversation(
    tmp_path: Path, environment_packages: list[str]
) -> None:
    spec = write_variant(EXAMPLES / "tool-env.yaml", tmp_path / "tool.yaml", TOOL_RUN)
    out = tmp_path / "run"
    with running(spec, out) as proc:
        wait_for_step(out, 6, proc, timeout_s=400)
        kill(out, "generator-1")  # its conversations in flight are lost, not half-trained
        output = finish(proc, timeout_s=600)
    assert "generator-1 exited with code -9" in output
    rows = read_jsonl(out / "history.jsonl")
    first, best = rows[0]["pass_rate"], max(r["pass_rate"] for r in rows[1:])
    print(f"\nheld-out pass rate: {[round(r['pass_rate'], 3) for r in rows]}")
    assert best >= first + 0.2
    assert_once_per_epoch(out)
    generation = rows[-1]["generation"]
    # Each rollout: one model turn at least; a tool call is a second one.
    assert generation["agent_turns"] > generation["generated_samples"] > 0
    assert (
        0 < generation["tool_calls"] <= generation["agent_turns"] - generation["generated_samples"]
    )
    last = sorted((out / "evaluations").glob("*.completions.jsonl"))[-1]
    conversations = [json.loads(line)["completion"] for line in last.read_text().splitlines()]
    # A tool call, the tool's turn marked as the environment's, the answer after it.
    assert any("<tool_call>" in c and "⟦" in c and "<|tool|>" in c for c in conversations)


# With the learning run above (a ToolEnv, disaggregated, pipelinerl), each environment trains in
# both placements and with both algorithms: a ToolEnv colocated with PPO-off-policy, and the
# MultiTurnEnv (guess-number) colocated with pipelinerl and disaggregated with PPO-off-policy.
# PPO-off-policy-2 to step 5: rounds end at steps 2, 4 and 5 (the last cut at the budget), each
# evaluating once, on the weights it ends with.
MATRIX = [
    ("tool-arith", "colocated", "ppo-off-policy", [0, 2, 4, 5]),
    ("guess-number", "colocated", "pipelinerl", [0, 1, 2, 3]),
    ("guess-number", "disaggregated", "ppo-off-policy", [0, 2, 4, 5]),
]


@pytest.mark.parametrize(("env_id", "placement", "algorithm", "evaluated"), MATRIX)
def test_each_environment_trains_in_each_placement_and_algorithm(
    tmp_path: Path,
    environment_packages: list[str],
    env_id: str,
    placement: str,
    algorithm: str,
    evaluated: list[int],
) -> None:
    variant = {
        "placement": placement,
        "environment": {"verifiers": {"id": env_id, "args": {"num_train": 64, "num_eval": 16}}},
        "data": {"validation": {"prompts": 16}},
        "recipe": {
            "algorithm": algorithm,
            "maxOffPolicySteps": 2,
            "batch": {"prompts": 4, "generationsPerPrompt": 4},
            "optimizer": {"warmupSteps": 1},
        },
        "evaluation": {"everySteps": 1, "generationsPerPrompt": 2},
        "budget": {"maxSteps": evaluated[-1]},
        "generators": {"replicas": 1},
    }
    spec = write_variant(EXAMPLES / "tool-env.yaml", tmp_path / "run.yaml", variant)
    out = tmp_path / "run"
    with running(spec, out) as proc:
        finish(proc, timeout_s=600)
    rows = read_jsonl(out / "history.jsonl")
    assert [r["step"] for r in rows] == evaluated
    generation = rows[-1]["generation"]
    assert generation["agent_turns"] > generation["generated_samples"] > 0  # several turns
    assert generation["environment_failures"] == 0
    assert (generation["tool_calls"] > 0) == (env_id == "tool-arith")
    assert rows[-1]["version"] == evaluated[-1]  # the policy was updated at every step


def test_an_openenv_server_on_this_machine_drives_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spec.environment.openenv.app: `scalerl run` starts the calculator server on 127.0.0.1, the
    generators' rollouts are its episodes (a WebSocket session each), the model's tool calls its
    steps. This model was never taught the server's `submit`: the server scores a `calculate` of
    the right value instead (a reward inline with the step)."""
    monkeypatch.setenv("OPENENV_CALCULATOR_SCORE_CALCULATE", "1")  # the server inherits it
    install_editable("openenv_calculator")
    rows = [
        {"prompt": f"What is {a}*{a + 13}?", "answer": str(a * (a + 13))} for a in range(20, 60)
    ]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    served = {
        "environment": {
            "verifiers": None,
            "openenv": {"app": "openenv_calculator.server:app"},
            "maxTurns": 3,
        },
        "data": {
            "train": str(train),
            "systemPrompt": "Reply with the number only.",
            "validation": {"prompts": 8},
        },
        "evaluation": {"everySteps": 1, "generationsPerPrompt": 2},
        "budget": {"maxSteps": 4},
        "recipe": {
            "batch": {"prompts": 4, "generationsPerPrompt": 2},
            "optimizer": {"warmupSteps": 1},
        },
        "generators": {"replicas": 1},
    }
    spec = write_variant(EXAMPLES / "tool-env.yaml", tmp_path / "served.yaml", served)
    out = tmp_path / "run"
    with running(spec, out) as proc:
        finish(proc, timeout_s=600)
    history = read_jsonl(out / "history.jsonl")
    generation = history[-1]["generation"]
    assert generation["tool_calls"] > 0 and generation["environment_failures"] == 0
    assert history[-1]["version"] >= 1  # rewards that differed: something was learnt from
    log = (out / "logs" / "openenv.log").read_text()
    assert log.count("WebSocket /ws") >= generation["generated_samples"] / 2, log[-2000:]
