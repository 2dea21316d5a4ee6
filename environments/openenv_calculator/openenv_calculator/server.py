"""The calculator as an OpenEnv environment server (openenv-core's MCPEnvironment and app).

Settings, from the server's environment:
- OPENENV_CALCULATOR_SESSIONS: concurrent episodes (WebSocket sessions) at most, 64 by default.
- OPENENV_CALCULATOR_DELAY_S: seconds each `calculate` waits before it answers, 0 by default (a
  slow tool, for clients' timeouts).
- OPENENV_CALCULATOR_SCORE_CALCULATE: "1" offers `calculate` alone and scores the episode's first
  one whose value is its answer 1.0 with the step (a reward inline with a tool call), for a model
  that answers by calculating (builtin:tool-arith); every other step scores 0, so repeating a
  right calculation earns nothing more (the adapter sums an episode's rewards). Unset, `submit`
  ends the episode and scores.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Any

# The calculator serves no web page. openenv's env_server package imports its Gradio interface
# whenever gradio is importable (4 of the server's 6 s of start-up CPU here) and goes without it on
# ModuleNotFoundError; unless ENABLE_WEB_INTERFACE asks for the page, we say gradio is absent.
if os.environ.get("ENABLE_WEB_INTERFACE", "false").lower() not in ("true", "1", "yes"):
    sys.modules.setdefault("gradio", None)  # type: ignore[assignment]

from fastmcp import FastMCP
from openenv.core.env_server import MCPEnvironment, create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State

from openenv_calculator.arithmetic import evaluate, same_number

SESSIONS = int(os.environ.get("OPENENV_CALCULATOR_SESSIONS", "64"))
DELAY_S = float(os.environ.get("OPENENV_CALCULATOR_DELAY_S", "0"))
SCORE_CALCULATE = os.environ.get("OPENENV_CALCULATOR_SCORE_CALCULATE") == "1"


class CalculatorEnvironment(MCPEnvironment):
    """One episode per session: calculate as often as needed, then submit once."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("calculator")
        self._expected: str | None = None
        self._reward: float | None = None  # set by submit, read by step_async
        self._calculated: str | None = None  # the last calculate's value, read by step_async
        self._paid = False  # the episode's right calculate was scored (SCORE_CALCULATE)
        self._state = State(episode_id=None, step_count=0)

        @mcp.tool()
        async def calculate(expression: str) -> str:
            """Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses).

            Args:
                expression: the expression, e.g. "37 * 48".
            """
            if DELAY_S > 0:
                await asyncio.sleep(DELAY_S)
            self._calculated = str(evaluate(expression))
            return self._calculated

        def submit(answer: str) -> str:
            """Submit the final answer; this ends the episode.

            Args:
                answer: the number that answers the question.
            """
            if self._expected is None:
                raise ValueError("no question: reset the episode with an answer first")
            if self._reward is not None:
                raise ValueError("the answer was already submitted")
            correct = same_number(answer, self._expected)
            self._reward = 1.0 if correct else 0.0
            return "correct" if correct else "incorrect"

        if not SCORE_CALCULATE:
            mcp.tool()(submit)

        super().__init__(mcp)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        answer: str | None = None,
        **kwargs: Any,
    ) -> Observation:
        self._expected = None if answer is None else str(answer)
        self._reward = None
        self._paid = False
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return Observation(done=False, reward=None)

    async def step_async(
        self, action: Action, timeout_s: float | None = None, **kwargs: Any
    ) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        return self._scored(action, observation)

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    def _scored(self, action: Action, observation: Observation) -> Observation:
        """The observation with the episode's reward: 0 for a tool call, the submission's score
        (and done) for the accepted submit."""
        if not isinstance(action, CallToolAction):
            return observation
        self._state.step_count += 1
        if (
            action.tool_name == "submit"
            and isinstance(observation, CallToolObservation)
            and observation.error is None
        ):
            observation.reward = self._reward
            observation.done = True
        elif action.tool_name == "calculate" and SCORE_CALCULATE:
            hit = (
                self._expected is not None
                and self._calculated is not None
                and same_number(self._calculated, self._expected)
            )
            observation.reward = float(hit and not self._paid)  # once per episode
            self._paid = self._paid or hit
        else:
            observation.reward = 0.0
        self._calculated = None
        return observation

    def _step_impl(
        self, action: Action, timeout_s: float | None = None, **kwargs: Any
    ) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": "use the MCP tools"})

    @property
    def state(self) -> State:
        return self._state


app = create_app(
    CalculatorEnvironment,
    CallToolAction,
    CallToolObservation,
    env_name="openenv_calculator",
    max_concurrent_envs=SESSIONS,
)
