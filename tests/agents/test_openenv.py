"""OpenEnv through scalerl's adapter: the calculator server of environments/openenv_calculator,
pip-installed as a user's package and served by uvicorn on 127.0.0.1 (LocalServer, as `scalerl
run` starts it), driven by `load_openenv` rollouts with a scripted model (a verifiers client that
answers with fixed tool calls: no model, no vLLM)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import verifiers as vf
from editable import install_editable
from scripted import scripted_response

from scalerl.agents.client import RolloutLog, current
from scalerl.agents.containment import contain
from scalerl.agents.load import environment_examples
from scalerl.agents.openenv import load_openenv
from scalerl.agents.openenv_server import URL_VARIABLE, LocalServer, ServerFailed
from scalerl.errors import DataError
from scalerl.generator.length import Allowance
from scalerl.spec import RunSpec, parse_run

APP = "openenv_calculator.server:app"
QUESTION = re.compile(r"What is (\d+)\*(\d+)\?")
ROWS = [(37, 48), (12, 91), (55, 55), (99, 13), (21, 34), (70, 11)]
Policy = Callable[[list[Any], int], Any]  # a reply, or a coroutine of one


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LocalServer]]:
    """Three calculator servers, started together: `fast`, `slow` (each calculate waits 3 s)
    and `doomed` (a test kills it mid-episode)."""
    install_editable("openenv_calculator")
    logs = tmp_path_factory.mktemp("servers")
    delays = {"fast": "0", "slow": "3", "doomed": "0"}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        started = {
            name: pool.submit(
                LocalServer.start, APP, logs / name, environ={"OPENENV_CALCULATOR_DELAY_S": s}
            )
            for name, s in delays.items()
        }
        running = {name: future.result() for name, future in started.items()}
    yield running
    for server in running.values():
        server.stop()


def spec_of(tmp_path: Path, url: str | None, tool_timeout_s: float = 30.0) -> RunSpec:
    """The calculator's run: six rows of data.train (two held out), its server at `url` (None:
    the app, which `scalerl run` would start)."""
    train = tmp_path / "train.jsonl"
    lines = [{"prompt": f"What is {a}*{b}?", "answer": str(a * b)} for a, b in ROWS]
    train.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": "calculator"},
        "spec": {
            "model": {"path": "/models/base"},
            "data": {"train": str(train), "validation": {"prompts": 2}},
            "environment": {
                "openenv": {"url": url} if url else {"app": APP},
                "toolTimeoutSeconds": tool_timeout_s,
                "maxTurns": 4,
            },
        },
    }
    return parse_run(run).spec


class Scripted(vf.Client):  # type: ignore[misc]
    """A model that answers each turn with `policy(messages, turn)`: {"calls": [(name, args)]}
    or {"content": text}; it records how many turns each rollout asked of it."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(object())
        self.policy = policy
        self.tools: list[Any] = []

    def setup_client(self, config: Any) -> Any:
        return object()

    async def to_native_tool(self, tool: Any) -> Any:
        return tool

    async def to_native_prompt(self, messages: Any) -> tuple[Any, dict[str, Any]]:
        return messages, {}

    async def get_native_response(
        self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kwargs: Any
    ) -> Any:
        self.tools.append(tools)
        turn = sum(1 for m in prompt if m.role == "assistant")
        reply = await _maybe_await(self.policy(prompt, turn))
        return scripted_response(reply, model, f"call-{turn}-")

    async def raise_from_native_response(self, response: Any) -> None:
        return None

    async def from_native_response(self, response: Any) -> Any:
        return response

    async def close(self) -> None:
        return None


async def _maybe_await(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


def factors(messages: list[Any]) -> tuple[int, int]:
    question = next(m.content for m in messages if m.role == "user")
    a, b = QUESTION.search(question).groups()  # type: ignore[union-attr]
    return int(a), int(b)


def solver(messages: list[Any], turn: int) -> dict[str, Any]:
    """Calculates the product with the tool, then submits what the tool said."""
    if turn == 0:
        a, b = factors(messages)
        return {"calls": [("calculate", json.dumps({"expression": f"{a} * {b}"}))]}
    return {"calls": [("submit", json.dumps({"answer": messages[-1].content}))]}


def play(env: Any, row: dict[str, Any], policy: Policy) -> tuple[Any, RolloutLog]:
    """One rollout of `row` as the generator runs it (contained, its own RolloutLog), scored."""

    async def rollout() -> tuple[Any, RolloutLog]:
        log = RolloutLog(Allowance(thinking=0, answer=10_000))
        current.set(log)
        state = await env.rollout(dict(row), Scripted(policy), "scripted", {})
        if state.get("error") is None:
            await env.rubric.score_group([state])
        return state, log

    return asyncio.run(rollout())


@pytest.fixture(scope="module")
def env(servers: dict[str, LocalServer], tmp_path_factory: pytest.TempPathFactory) -> Any:
    spec = spec_of(tmp_path_factory.mktemp("fast"), servers["fast"].url)
    loaded = load_openenv(spec)
    assert spec.environment is not None
    contain(loaded, spec.environment)
    return loaded


def rows(env: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in env.get_dataset()]


def text(message: Any) -> str:
    return str(message.content)


# --- loading ---------------------------------------------------------------------------------


def test_the_servers_tools_are_offered_to_the_model_with_their_schemas(env: Any) -> None:
    tools = {t.name: t for t in env.tool_defs}
    assert sorted(tools) == ["calculate", "submit"]
    assert tools["calculate"].parameters["properties"]["expression"]["type"] == "string"
    assert tools["calculate"].parameters["required"] == ["expression"]
    assert "ends the episode" in tools["submit"].description


def test_the_prompts_are_spec_data_train_with_its_held_out_rows(
    env: Any, tmp_path: Path, servers: dict[str, LocalServer]
) -> None:
    spec = spec_of(tmp_path, servers["fast"].url)
    train, held_out = environment_examples(env, spec)
    assert (len(train), len(held_out)) == (4, 2)
    questions = {e.prompt: e.answer for e in train + held_out}
    assert questions == {f"What is {a}*{b}?": str(a * b) for a, b in ROWS}
    first = train[0].inputs or {}
    assert first["prompt"] == [{"role": "user", "content": train[0].prompt}]
    assert first["info"]["id"]  # the row's id in data.train goes to reset


def test_the_url_comes_from_the_environment_variable_and_no_server_is_a_clear_error(
    tmp_path: Path, servers: dict[str, LocalServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_of(tmp_path, None)
    monkeypatch.delenv(URL_VARIABLE, raising=False)
    with pytest.raises(DataError, match=f"spec.environment.openenv: no server.*{URL_VARIABLE}"):
        load_openenv(spec)
    monkeypatch.setenv(URL_VARIABLE, servers["fast"].url)
    assert load_openenv(spec).url == servers["fast"].url
    nowhere = "http://127.0.0.1:9"  # discard: nothing listens there
    with pytest.raises(DataError, match=f"no OpenEnv server answered at {nowhere} within 1 s"):
        load_openenv(spec, url=nowhere, wait_s=1.0)


# --- rollouts --------------------------------------------------------------------------------


def test_a_solved_episode_reads_the_tool_result_and_is_scored_one(env: Any) -> None:
    row = rows(env)[0]
    a, b = factors([vf.UserMessage(content=row["prompt"][-1]["content"])])
    state, log = play(env, row, solver)
    completion = state["completion"]
    assert [m.role for m in completion] == ["assistant", "tool", "assistant", "tool"]
    assert text(completion[1]) == str(a * b)  # the server's calculate, read by the model
    assert text(completion[3]) == "correct"
    assert state["reward"] == 1.0 and state["stop_condition"] == "has_final_env_response"
    assert len(state["trajectory"]) == 2  # done ended it: no model turn after the submit
    assert state["openenv_episode"] == {"id": state["trajectory_id"], "steps": 2}
    assert log.tool_errors == 0 and log.env_seconds > 0


def test_a_wrong_submission_scores_zero_and_ends_the_episode(env: Any) -> None:
    def wrong(messages: list[Any], turn: int) -> dict[str, Any]:
        return {"calls": [("submit", json.dumps({"answer": "1"}))]}

    state, _ = play(env, rows(env)[1], wrong)
    assert state["reward"] == 0.0 and text(state["completion"][-1]) == "incorrect"
    assert len(state["trajectory"]) == 1


def test_a_tool_error_is_read_by_the_model_and_counted_and_the_episode_goes_on(env: Any) -> None:
    def careless(messages: list[Any], turn: int) -> dict[str, Any]:
        if turn == 0:
            calculate = ("calculate", json.dumps({"expression": "1/0"}))
            return {"calls": [calculate, ("no_such_tool", "{}"), ("calculate", "not json")]}
        return solver(messages, turn - 1)  # within maxTurns 4: three turns

    state, log = play(env, rows(env)[2], careless)
    tools = [text(m) for m in state["completion"] if m.role == "tool"]
    assert tools[0].startswith("Error:") and "division by zero" in tools[0]
    assert tools[1].startswith("Error:") and "no_such_tool" in tools[1]
    assert tools[2].startswith("Error: arguments are not JSON")
    assert state["reward"] == 1.0 and log.tool_errors == 2  # the server's two; the JSON is ours
    assert state["openenv_episode"]["steps"] == 4  # 1/0, unknown tool, calculate, submit


def test_an_answer_without_a_tool_call_ends_the_rollout_unscored(env: Any) -> None:
    state, _ = play(env, rows(env)[3], lambda messages, turn: {"content": "I think 42."})
    assert state["reward"] == 0.0 and state["stop_condition"] == "answered"
    assert state["openenv_episode"]["steps"] == 0


def test_each_rollout_has_its_own_session_on_the_server(env: Any) -> None:
    """Four episodes open at once, each with its own answer: every submission is judged against
    its own reset, and each session counted only its own steps."""
    barrier = asyncio.Barrier(4)

    async def together(messages: list[Any], turn: int) -> dict[str, Any]:
        if turn == 1:
            await barrier.wait()  # every episode has reset and calculated before any submits
        return solver(messages, turn)

    async def four() -> list[Any]:
        async def one(row: dict[str, Any]) -> Any:
            current.set(RolloutLog(Allowance(thinking=0, answer=10_000)))
            return await env.rollout(row, Scripted(together), "scripted", {})

        states = await asyncio.gather(*(one(r) for r in rows(env)[:4]))
        await env.rubric.score_group(list(states))
        return list(states)

    states = asyncio.run(four())
    assert [s["reward"] for s in states] == [1.0] * 4
    episodes = [s["openenv_episode"] for s in states]
    assert len({e["id"] for e in episodes}) == 4 and all(e["steps"] == 2 for e in episodes)


def test_a_tool_that_outlasts_its_timeout_is_an_error_the_model_reads_and_ends_the_episode(
    servers: dict[str, LocalServer], tmp_path: Path
) -> None:
    spec = spec_of(tmp_path, servers["slow"].url, tool_timeout_s=0.5)
    slow = load_openenv(spec)
    assert spec.environment is not None
    contain(slow, spec.environment)
    state, log = play(slow, rows(slow)[0], solver)
    assert (
        text(state["completion"][-1])
        == "Error: tool calculate timed out after 0.5 s; the episode ends"
    )
    assert len(state["trajectory"]) == 1 and state["reward"] == 0.0 and log.tool_errors == 1
    assert "openenv_episode" not in state  # the session was out of step: closed unasked


def test_a_server_that_dies_mid_rollout_fails_the_rollout_not_the_generator(
    servers: dict[str, LocalServer], tmp_path: Path
) -> None:
    doomed = servers["doomed"]
    env = load_openenv(spec_of(tmp_path, doomed.url))

    def killer(messages: list[Any], turn: int) -> dict[str, Any]:
        if turn == 1:
            doomed.stop(grace_s=0)  # SIGKILL: the server goes mid-episode
        return solver(messages, turn)

    state, _ = play(env, rows(env)[0], killer)
    assert isinstance(state["error"], vf.InfraError) and "failed mid-episode" in str(state["error"])
    assert "openenv_session" not in state  # closed by the cleanup all the same
    again, _ = play(env, rows(env)[1], solver)  # a new rollout: reset fails, cleanly
    assert isinstance(again["error"], vf.InfraError) and "reset failed" in str(again["error"])


# --- the local server ------------------------------------------------------------------------


def test_a_server_that_does_not_come_up_names_the_app_and_shows_its_output(tmp_path: Path) -> None:
    log = tmp_path / "openenv.log"
    with pytest.raises(ServerFailed) as caught:
        LocalServer.start("no_such_module_here:app", log, ready_timeout_s=60)
    message = str(caught.value)
    assert "spec.environment.openenv.app 'no_such_module_here:app'" in message
    assert "exited with code 3" in message  # uvicorn's: the app did not import
    assert 'Could not import module "no_such_module_here"' in message  # its output's tail
