"""A group of rollouts of one prompt through the environment, as the generator samples them.

Each rollout runs the environment's own `rollout` (its turns, tools and stop conditions) against
`EngineClient`, with the rollout's `RolloutLog` as the task's context; then the environment's
rubric scores the group (group reward functions see all of it, as in verifiers), and each rollout
becomes one `Sample` (`scalerl.agents.conversation`).

A rollout that fails (the environment raised, ran past spec.environment.rolloutTimeoutSeconds,
or the engine failed under it) is dropped and counted, never trained on and never fatal: the
generator goes on with the rest of the group.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from scalerl.agents.client import (
    EngineClient,
    RolloutLog,
    chat_message,
    current,
    native_tool,
    render,
)
from scalerl.agents.conversation import to_sample
from scalerl.generator.prompts import Example
from scalerl.rollout.records import Conversation, Sample
from scalerl.spec import EnvironmentSpec

log = logging.getLogger("scalerl.agents")
MODEL_NAME = "scalerl"  # what the environment is told the model is called


@dataclass
class Failures:
    """Rollouts dropped since the generator last took the count (its metrics)."""

    count: int = 0

    def add(self) -> None:
        self.count += 1

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


@dataclass
class AgentRollouts:
    env: Any  # a verifiers Environment, contained (scalerl.agents.containment)
    client: EngineClient
    spec: EnvironmentSpec
    failures: Failures = field(default_factory=Failures)

    def prompt_ids(self, example: Example) -> list[int]:
        """The first context of the prompt's rollouts (`first_context`)."""
        return first_context(self.env, self.client.tokens.tokenizer, example)

    async def sample(self, example: Example, n: int, seed: str | None = None) -> list[Sample]:
        """`n` scored rollouts of `example`, less those that failed (counted)."""
        logs = [self.client.start(None if seed is None else f"{seed}/{j}") for j in range(n)]
        states = await asyncio.gather(*(self._rollout(example, lg) for lg in logs))
        done = [(s, lg) for s, lg in zip(states, logs, strict=True) if s is not None]
        if not done:
            return []
        try:
            await self.env.rubric.score_group([s for s, _ in done])
        except Exception as err:  # the environment's rubric
            log.warning("the rubric failed on prompt %s: %s", example.id, err)
            self.failures.add()
            return []
        prompt_ids = self.prompt_ids(example)
        return [self._sample(state, lg, prompt_ids) for state, lg in done]

    async def _rollout(self, example: Example, rollout: RolloutLog) -> Any:
        current.set(rollout)  # this coroutine runs as a task of its own (gather)
        inputs = dict(example.inputs or {})
        try:
            state = await asyncio.wait_for(
                self.env.rollout(inputs, self.client, MODEL_NAME, {}),
                self.spec.rollout_timeout_seconds,
            )
        except TimeoutError:
            self._drop(example, "timeout", f"ran past {self.spec.rollout_timeout_seconds:g} s")
            return None
        except Exception as err:  # the environment's code
            self._drop(example, "environment", f"{type(err).__name__}: {err}")
            return None
        error = state.get("error")
        if error is not None and not rollout.overlong:
            self._drop(example, "environment", f"{type(error).__name__}: {error}")
            return None
        if not rollout.turns:
            self._drop(example, "no_turn", "the model never took a turn (prompt too long?)")
            return None
        return state

    def _drop(self, example: Example, why: str, detail: str) -> None:
        log.warning("dropped a rollout of prompt %s (%s): %s", example.id, why, detail)
        self.failures.add()

    def _sample(self, state: Any, rollout: RolloutLog, prompt_ids: list[int]) -> Sample:
        turns = rollout.turns
        truncated = (
            bool(state.get("is_truncated"))
            or rollout.overlong
            or any(t.sample.truncated for t in turns)
        )
        stats = Conversation(
            turns=len(turns),
            tool_calls=_tool_calls(state.get("completion") or []),
            tool_errors=rollout.tool_errors,
            env_seconds=rollout.env_seconds,
        )
        reward = state.get("reward")
        return to_sample(
            turns,
            prompt_ids,
            reward=float(reward) if reward is not None else 0.0,
            truncated=truncated,
            pass_threshold=self.spec.pass_threshold,
            stats=stats,
        )


def first_context(env: Any, tokenizer: Any, example: Example) -> list[int]:
    """The context the first model turn of `example`'s rollouts sees: its messages and the
    environment's tools, rendered by the chat template."""
    from verifiers.utils.message_utils import normalize_messages

    prompt = (example.inputs or {}).get("prompt") or []
    messages = [chat_message(m) for m in normalize_messages(prompt, field_name="prompt")]
    return render(tokenizer, messages, [native_tool(t) for t in env.tool_defs or []])


def _tool_calls(completion: list[Any]) -> int:
    return sum(
        len(getattr(m, "tool_calls", None) or [])
        for m in completion
        if getattr(m, "role", None) == "assistant"
    )
