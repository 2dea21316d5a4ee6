"""OpenEnv environment servers as verifiers environments: scalerl's adapter.

`load_openenv` returns a verifiers `MultiTurnEnv` whose rollouts talk to an OpenEnv server
(openenv-core's `MCPToolClient`, over the server's `/ws` WebSocket). The protocol, per rollout:

1. One WebSocket session: one episode, its own environment instance on the server.
2. `reset` with the row's fields: `episode_id` (the rollout's trajectory id), `answer`, `prompt`
   (the user's text) and `example_id` (the row's id in spec.data.train); the server takes those
   its `reset` accepts.
3. The server's MCP tools (OpenEnv's `ListToolsAction`, asked once when the environment loads)
   are the tools the model is offered, their input schemas as the tools' parameters.
4. Each tool call of the model is one `step(CallToolAction(name, arguments))`; the observation
   comes back as the tool's message (its text content; a `ToolError` as "Error: ...", counted as
   the rollout's tool error, the episode going on).
5. The episode's reward is the SUM of the step observations' rewards (None counts 0), as an
   episode's return; an observation with `done` ends the rollout after its tool message. A
   model turn without a tool call ends it too (the model has answered).
6. The session is asked for its `state` (the server's episode id and step count) and closed when
   the rollout ends, however it ends.

What fails the rollout (dropped and counted by the generator, never fatal): the server cannot be
reached, the connection drops mid-episode, or `reset` fails. A tool step that outlasts
spec.environment.toolTimeoutSeconds is a tool error the model reads, and ends the episode: the
session's late reply would be read as the next step's.

The prompts are spec.data.train's rows (and its held-out ones), as `data.train` + `data.reward`
runs read them; the server scores them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import verifiers as vf
from verifiers.types import Messages, State, ToolMessage
from websockets.exceptions import WebSocketException

from scalerl.agents.openenv_server import URL_VARIABLE
from scalerl.errors import DataError
from scalerl.generator.prompts import Example, train_and_validation
from scalerl.spec import RunSpec

FIELD = "spec.environment.openenv"
SERVER_WAIT_S = 300.0  # how long loading waits for the server to answer (a pod starting)
CONNECT_TIMEOUT_S = 10.0
T = TypeVar("T")


class OpenEnvToolError(Exception):
    """A tool call the server answered with an error (or could not finish in time)."""


def load_openenv(spec: RunSpec, url: str | None = None, wait_s: float = SERVER_WAIT_S) -> Any:
    """The run's OpenEnv server as a verifiers environment (module doc). The server is `url`,
    else spec.environment.openenv.url, else $SCALERL_OPENENV_URL (set by the local runner and
    the operator); its tools are listed now, waiting up to `wait_s` for it to answer."""
    environment = spec.environment
    if environment is None or environment.openenv is None:
        raise DataError(f"{FIELD}: not set")
    base = url or environment.openenv.url or os.environ.get(URL_VARIABLE)
    if not base:
        raise DataError(
            f"{FIELD}: no server to talk to: set url, or app (scalerl run starts it) or image "
            f"(the operator runs it), which set {URL_VARIABLE} for the generators"
        )
    tools = _blocking(_list_tools(base, wait_s))
    train, held_out = train_and_validation(spec.data, spec.seed)
    return OpenEnvTools(
        url=base,
        step_timeout_s=environment.tool_timeout_seconds,
        tool_defs=tools,
        dataset=_rows(train),
        eval_dataset=_rows(held_out),
        system_prompt=spec.data.system_prompt,
        max_turns=environment.max_turns,
        env_id="openenv",
    )


async def episode_reward(state: State) -> float:
    """The sum of the episode's step rewards."""
    return float(sum(state.get("openenv_rewards") or []))


class OpenEnvTools(vf.MultiTurnEnv):  # type: ignore[misc]
    """An OpenEnv server's episodes as verifiers rollouts (module doc)."""

    def __init__(self, url: str, step_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(rubric=vf.Rubric(funcs=[episode_reward], weights=[1.0]), **kwargs)
        self.url = url
        self.step_timeout_s = step_timeout_s

    async def setup_state(self, state: State) -> State:
        from openenv.core.mcp_client import MCPToolClient

        session = MCPToolClient(
            base_url=self.url,
            connect_timeout_s=CONNECT_TIMEOUT_S,
            message_timeout_s=self.step_timeout_s,
        )
        state["openenv_session"] = session
        state["openenv_rewards"] = []
        state["openenv_done"] = False
        state["openenv_broken"] = False  # a step timed out: the session is out of step
        try:
            await session.connect()
            await session.reset(**_reset_fields(state))
        except (OSError, WebSocketException, RuntimeError, TimeoutError) as err:
            raise vf.InfraError(f"OpenEnv server {self.url}: reset failed: {err}") from err
        return state

    async def env_response(self, messages: Messages, state: State, **kwargs: Any) -> Messages:
        calls = getattr(messages[-1], "tool_calls", None) or []
        replies: list[ToolMessage] = []
        for call in calls:
            if state["openenv_done"]:
                text = "Error: not run: the episode is over"
            else:
                text = await self._reply(call, state)
            replies.append(ToolMessage(role="tool", content=text, tool_call_id=call.id))
        if state["openenv_done"]:
            state["final_env_response"] = replies  # no model turn after the episode's end
        return replies

    async def _reply(self, call: Any, state: State) -> str:
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise OpenEnvToolError(f"arguments must be a JSON object, not {call.arguments}")
            return await self.call_tool(call.name, arguments, state)
        except json.JSONDecodeError as err:
            return f"Error: arguments are not JSON ({err}): {call.arguments[:200]}"
        except OpenEnvToolError as err:
            return f"Error: {err}"

    async def call_tool(self, name: str, arguments: dict[str, Any], state: State) -> str:
        """One step of the episode: the tool's text, or OpenEnvToolError (a tool error)."""
        from openenv.core.env_server.mcp_types import CallToolAction

        session = state["openenv_session"]
        try:
            result = await session.step(CallToolAction(tool_name=name, arguments=arguments))
        except TimeoutError:
            state["openenv_broken"] = state["openenv_done"] = True
            raise OpenEnvToolError(
                f"tool {name} timed out after {self.step_timeout_s:g} s; the episode ends"
            ) from None
        except RuntimeError as err:  # the server's environment raised in step (the session lives)
            raise OpenEnvToolError(str(err)) from None
        except (OSError, WebSocketException) as err:  # refused, reset, closed: the server died
            raise vf.InfraError(f"OpenEnv server {self.url} failed mid-episode: {err}") from err
        if result.reward is not None:
            state["openenv_rewards"].append(float(result.reward))
        state["openenv_done"] = state["openenv_done"] or bool(result.done)
        return observation_text(result.observation)

    @vf.stop  # type: ignore[untyped-decorator]
    async def answered(self, state: State) -> bool:
        """The model's last turn called no tool: its answer ends the episode."""
        if not state["trajectory"]:
            return False
        last = state["trajectory"][-1]["completion"][-1]
        return last.role == "assistant" and not getattr(last, "tool_calls", None)

    @vf.cleanup  # type: ignore[untyped-decorator]
    async def close_session(self, state: State) -> None:
        session = state.pop("openenv_session", None)
        if session is None:
            return
        if not state.get("openenv_broken") and state.get("error") is None:
            try:
                server = await session.state()
                state["openenv_episode"] = {"id": server.episode_id, "steps": server.step_count}
            except Exception:  # the episode is over either way; the record is a courtesy
                pass
        try:
            await session.close()
        except Exception:
            pass  # already gone with the server


def observation_text(observation: Any) -> str:
    """What the model reads of a tool step's observation: the tool's text content, or its error
    as "Error: ..." (raised as OpenEnvToolError)."""
    error = getattr(observation, "error", None)
    if error is not None:
        raise OpenEnvToolError(getattr(error, "message", str(error)))
    result = getattr(observation, "result", None)
    if isinstance(result, dict):
        texts = [
            str(part.get("text", ""))
            for part in result.get("content") or []
            if isinstance(part, dict) and part.get("type") == "text"
        ]
        if texts:
            return "\n".join(texts)
        if "data" in result:
            result = result["data"]
    if isinstance(result, str):
        return result
    return json.dumps(result, default=str)


def _reset_fields(state: State) -> dict[str, Any]:
    info = state.get("info") or {}
    prompt = [m for m in state["prompt"] if getattr(m, "role", None) == "user"]
    return {
        "episode_id": state["trajectory_id"],
        "answer": state.get("answer", ""),
        "prompt": prompt[-1].content if prompt else "",
        "example_id": info.get("id") if isinstance(info, dict) else None,
    }


def _rows(examples: list[Example]) -> Any:
    """spec.data's prompts as a verifiers dataset: the prompt as the user's message."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": e.prompt}],
                "answer": e.answer,
                "info": {"id": e.id, "source": e.source},
            }
            for e in examples
        ]
    )


async def _list_tools(url: str, wait_s: float) -> list[vf.Tool]:
    """The server's MCP tools as verifiers tools, asked until it answers or `wait_s` passes."""
    from openenv.core.mcp_client import MCPToolClient

    deadline = time.monotonic() + wait_s
    while True:
        session = MCPToolClient(base_url=url, connect_timeout_s=CONNECT_TIMEOUT_S)
        try:
            await session.connect()
            tools = await session.list_tools(use_cache=False)
            break
        except (OSError, WebSocketException, TimeoutError) as err:
            if time.monotonic() >= deadline:
                raise DataError(
                    f"{FIELD}: no OpenEnv server answered at {url} within {wait_s:g} s: {err}"
                ) from None
            await asyncio.sleep(1.0)
        except RuntimeError as err:  # the server answered ListToolsAction with an error
            raise DataError(
                f"{FIELD}: the server at {url} could not list its tools: {err}"
            ) from None
        finally:
            await session.close()
    if not tools:
        raise DataError(
            f"{FIELD}: the server at {url} offers no MCP tools (ListToolsAction): the adapter "
            "drives environments whose actions are MCP tool calls (openenv-core MCPEnvironment)"
        )
    return [
        vf.Tool(name=t.name, description=t.description, parameters=t.input_schema) for t in tools
    ]


def _blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run `work` to its end from synchronous code, in a thread of its own where this one
    already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()
