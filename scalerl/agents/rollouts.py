"""A group of rollouts of one prompt through the environment, as the generator samples them.

Each rollout runs the environment's own `rollout` (its turns, tools and stop conditions) against
`EngineClient`, with the rollout's `RolloutLog` as the task's context; then the environment's
rubric scores the group (group reward functions see all of it, as in verifiers), and each rollout
becomes one `Sample` (`scalerl.agents.conversation`).

A rollout that fails (the environment raised, ran past spec.environment.rolloutTimeoutSeconds,
or the engine failed under it) is dropped and counted, never trained on and never fatal: the
generator goes on with the rest of the group. `play` says why of each (`Played.dropped`): an
evaluation counts it as not passed.

A reward function of the rubric that raises (or returns no number) is scored 0 by verifiers and
only logged; `watch_rubric` makes it seen: the rollout keeps the reward verifiers gave it but
carries the error (`Sample.reward_error`), so it never passes, is counted in reward_errors and is
unscored in an evaluation. A rubric whose `score_group` itself raises gives every rollout of the
group that error and reward 0. (A rubric that overrides verifiers' calls of its functions and
swallows their errors itself cannot be seen.)
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
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
from scalerl.status.history import ROLLOUT_FAILED

log = logging.getLogger("scalerl.agents")
MODEL_NAME = "scalerl"  # what the environment is told the model is called
# A state's key for what its rubric's reward functions raised (`watch_rubric`).
REWARD_ERRORS = "scalerl_reward_errors"


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
class Played:
    """A group of rollouts of one prompt: the scored ones, and why each of the others was
    dropped (ROLLOUT_FAILED), so that the samples asked for are len(samples) + len(dropped)."""

    samples: list[Sample]
    dropped: list[str] = field(default_factory=list)


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
        return (await self.play(example, n, seed)).samples

    async def play(self, example: Example, n: int, seed: str | None = None) -> Played:
        """`n` rollouts of `example`, scored; those that failed dropped (counted, with why)."""
        watch_rubric(self.env.rubric)  # where it was replaced since (idempotent)
        logs = [self.client.start(None if seed is None else f"{seed}/{j}") for j in range(n)]
        states = await asyncio.gather(*(self._rollout(example, lg) for lg in logs))
        done = [(s, lg) for s, lg in zip(states, logs, strict=True) if s is not None]
        dropped = [ROLLOUT_FAILED] * (n - len(done))
        if not done:
            return Played([], dropped)
        failed = ""
        try:
            await self.env.rubric.score_group([s for s, _ in done])
        except Exception as err:  # the environment's rubric: every rollout's reward is unknown
            failed = f"the rubric raised: {type(err).__name__}: {err}"
            log.warning("prompt %s: %s; its %d rollouts failed", example.id, failed, len(done))
        prompt_ids = self.prompt_ids(example)
        samples = [self._sample(state, lg, prompt_ids, failed) for state, lg in done]
        for sample in samples:
            if sample.reward_error and not failed:
                log.warning("prompt %s: %s; scored as failed", example.id, sample.reward_error)
        return Played(samples, dropped)

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

    def _sample(
        self, state: Any, rollout: RolloutLog, prompt_ids: list[int], failed: str = ""
    ) -> Sample:
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
        reward = None if failed else state.get("reward")
        sample = to_sample(
            turns,
            prompt_ids,
            reward=float(reward) if reward is not None else 0.0,
            truncated=truncated,
            pass_threshold=self.spec.pass_threshold,
            stats=stats,
        )
        sample.reward_error = failed or "; ".join(state.get(REWARD_ERRORS) or [])
        return sample


def watch_rubric(rubric: Any) -> None:
    """Make `rubric` (verifiers', a RubricGroup's parts too) note in each state what its reward
    functions raised (REWARD_ERRORS), which verifiers catches, logs and scores 0. Its calls of
    one function on one state, and of a group function on all, are wrapped on the instance (its
    class is left as it is): the function each is handed records its error and re-raises it, so
    verifiers scores as it would. Idempotent."""
    if rubric is None or getattr(rubric, "_scalerl_watched", False):
        return
    for part in getattr(rubric, "rubrics", None) or []:
        watch_rubric(part)
    individual = getattr(rubric, "_call_individual_reward_func", None)
    group = getattr(rubric, "_call_group_reward_func", None)
    if individual is not None:

        async def call_individual(func: Callable[..., Any], state: Any) -> Any:
            recording = _recording(func, lambda why: _note(state, why), _number)
            return await individual(recording, state)

        rubric._call_individual_reward_func = call_individual
    if group is not None:

        async def call_group(func: Callable[..., Any], states: list[Any]) -> Any:
            def note(why: str) -> None:
                for state in states:
                    _note(state, why)

            recording = _recording(func, note, lambda result: _numbers(result, len(states)))
            return await group(recording, states)

        rubric._call_group_reward_func = call_group
    rubric._scalerl_watched = True


def _note(state: Any, why: str) -> None:
    state.setdefault(REWARD_ERRORS, []).append(why)


def _recording(
    func: Callable[..., Any], note: Callable[[str], None], check: Callable[[Any], str]
) -> Callable[..., Any]:
    """`func` as verifiers calls it (its signature and name: `functools.wraps`), noting what it
    raised (then raising it on) or why what it returned is no score (`check`)."""
    name = getattr(func, "__name__", repr(func))

    def noted(err: Exception) -> None:
        note(f"reward function {name} raised {type(err).__name__}: {err}")

    def checked(result: Any) -> Any:
        problem = check(result)
        if problem:
            note(f"reward function {name} returned {problem}")
        return result

    async def awaited(pending: Awaitable[Any]) -> Any:
        try:
            return checked(await pending)
        except Exception as err:
            noted(err)
            raise

    @functools.wraps(func)
    def recording(*args: Any, **kwargs: Any) -> Any:
        try:
            result = func(*args, **kwargs)
        except Exception as err:
            noted(err)
            raise
        return awaited(result) if inspect.isawaitable(result) else checked(result)

    return recording


def _number(result: Any) -> str:
    """ "" when `result` is a reward verifiers can read as a number, else what it is."""
    try:
        float(result)
    except (TypeError, ValueError):
        return f"{type(result).__name__} {str(result)[:80]!r}, not a number"
    return ""


def _numbers(result: Any, count: int) -> str:
    """ "" when `result` is `count` numbers (a group reward function's), else what is wrong."""
    if not isinstance(result, list | tuple) or len(result) != count:
        return f"{type(result).__name__} {str(result)[:80]!r}, not {count} numbers"
    return next((problem for value in result if (problem := _number(value))), "")


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
