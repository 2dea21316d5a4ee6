"""The verifiers client that is our own engine: messages in, the model's turn out, recorded.

A verifiers environment asks its client for each model turn (`Client.get_response`). This one
renders the conversation with the model's chat template (the environment's tools included),
samples the turn from the generator's engine token in and token out, under the recipe's length
rules with what is left of the rollout's budgets (its turns share one thinking cutoff and one
answer budget: scalerl.generator.length) and of the model's context, and records the turn
(context, tokens, log-probs, policy versions) in the rollout's `RolloutLog`. The environment
gets back an assistant message whose tool calls are parsed from the model's text
(`scalerl.agents.toolcalls`); nothing of it is re-tokenized for training.

The environment's sampling arguments are not used: the run's recipe decides how to sample.
"""

from __future__ import annotations

import contextvars
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import verifiers as vf

from scalerl.agents.conversation import Turn
from scalerl.agents.toolcalls import parse_tool_calls
from scalerl.generator.length import Allowance
from scalerl.generator.tokens import ModelTokens
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.rollout.records import Sample

# (context ids, what the rollout has left, seed) -> the engine's sample of one model turn.
SampleTurn = Callable[[list[int], Allowance, "str | None"], Awaitable[Sample]]


@dataclass
class RolloutLog:
    """What one rollout's model turns and tools did, as the client and the tools record it."""

    left: Allowance  # what the rollout's model turns may still sample (the recipe's budgets)
    seed: str | None = None  # an evaluation's: turn k samples with seed/k
    turns: list[Turn] = field(default_factory=list)
    tool_errors: int = 0
    env_seconds: float = 0.0
    overlong: bool = False  # a context outgrew the model (or the budget ran out before a turn)


# The rollout being run in this task: verifiers calls the client and the tools from inside it.
current: contextvars.ContextVar[RolloutLog] = contextvars.ContextVar("scalerl_rollout")


class EngineClient(vf.Client):  # type: ignore[misc]
    """verifiers' `Client` over the generator's engine (module doc)."""

    def __init__(
        self,
        sample_turn: SampleTurn,
        tokens: ModelTokens,
        max_model_len: int,
        plan: InterruptionPlan,
        seed: int = 0,
    ) -> None:
        super().__init__(sample_turn)
        self.sample_turn = sample_turn
        self.tokens = tokens
        self.max_model_len = max_model_len
        self.plan = plan
        self._rng = random.Random(seed)

    def start(self, seed: str | None = None) -> RolloutLog:
        """A new rollout's log, with the recipe's budgets: a thinking cutoff drawn from the
        interruption window (from `seed` alone when given, as the engine draws a sample's) and
        the answer budget; a model that does not think has only the answer budget."""
        rng = self._rng if seed is None else random.Random(f"{seed}/cutoffs")
        return RolloutLog(Allowance(self.plan.cutoff(rng), self.plan.answer_budget), seed)

    def setup_client(self, config: Any) -> Any:
        raise TypeError("EngineClient wraps the generator's engine; it is not configured")

    async def to_native_tool(self, tool: Any) -> dict[str, Any]:
        return native_tool(tool)

    async def to_native_prompt(self, messages: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return [chat_message(m) for m in messages], {}

    async def get_native_response(
        self,
        prompt: list[dict[str, Any]],
        model: str,
        sampling_args: Any,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> Turn:
        log = current.get()
        ids = render(self.tokens.tokenizer, prompt, tools)
        problem = self._no_room(log.left, len(ids))
        if problem is not None:
            log.overlong = True
            raise vf.OverlongPromptError(problem)
        seed = None if log.seed is None else f"{log.seed}/turn-{len(log.turns)}"
        sample = await self.sample_turn(ids, log.left, seed)
        log.left = log.left.after(sample, self.tokens.think_end_id)
        turn = Turn(ids, sample)
        log.turns.append(turn)
        return turn

    def _no_room(self, left: Allowance, context: int) -> str | None:
        """Why a turn cannot be sampled (the rollout then ends truncated), or None."""
        if context >= self.max_model_len:
            return (
                f"the conversation ({context} tokens) leaves no room for a model turn within "
                f"max_model_len {self.max_model_len}"
            )
        if left.answer <= 0:
            return "the rollout's answer budget is spent"
        if self.tokens.think_end_id is not None and left.thinking <= 0 and not self.plan.enabled:
            return "the rollout's thinking budget is spent (interruption is disabled)"
        return None

    async def raise_from_native_response(self, response: Turn) -> None:
        return None

    async def from_native_response(self, response: Turn) -> Any:
        sample = response.sample
        reasoning, answer = self._split_thinking(sample.completion_ids)
        content, calls = parse_tool_calls(answer)
        finish = "length" if sample.truncated else ("tool_calls" if calls else "stop")
        message = vf.ResponseMessage(
            content=content,
            reasoning_content=reasoning,
            tool_calls=[
                vf.ToolCall(id=f"call-{uuid.uuid4().hex[:12]}", name=c.name, arguments=c.arguments)
                for c in calls
            ]
            or None,
            finish_reason=finish,
            is_truncated=sample.truncated,
            tokens=vf.ResponseTokens(
                prompt_ids=response.prompt_ids,
                prompt_mask=[0] * len(response.prompt_ids),
                completion_ids=sample.completion_ids,
                completion_mask=sample.loss_mask,
                completion_logprobs=sample.logprobs,
            ),
        )
        usage = vf.Usage(
            prompt_tokens=len(response.prompt_ids),
            reasoning_tokens=0,
            completion_tokens=len(sample.completion_ids),
            total_tokens=len(response.prompt_ids) + len(sample.completion_ids),
        )
        return vf.Response(
            id=f"scalerl-{uuid.uuid4().hex[:12]}",
            created=int(time.time()),
            model="scalerl",
            usage=usage,
            message=message,
        )

    def _split_thinking(self, ids: list[int]) -> tuple[str | None, str]:
        """(the thinking, the answer) of a turn, EOS left out; no thinking: (None, all)."""
        ids = [t for t in ids if t not in self.tokens.eos_ids]
        end = self.tokens.think_end_id
        if end is None:
            return None, self._decode(ids)
        if end not in ids:  # still thinking when the turn ended: no answer
            return self._decode(ids), ""
        cut = len(ids) - ids[::-1].index(end)
        return self._decode(ids[: cut - 1]), self._decode(ids[cut:])

    def _decode(self, ids: list[int]) -> str:
        text: str = self.tokens.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    async def close(self) -> None:
        return None


def render(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    """The context of the model's next turn: the chat template's token ids of `messages` and
    `tools`, with the generation prompt."""
    ids = tokenizer.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):  # a BatchEncoding (transformers 5 returns one with tools)
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def native_tool(tool: Any) -> dict[str, Any]:
    """A verifiers tool as chat templates take tools (OpenAI's function schema)."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def chat_message(message: Any) -> dict[str, Any]:
    """A verifiers message as the chat template takes it (Hugging Face's message dicts)."""
    out: dict[str, Any] = {"role": message.role, "content": _text(message.content)}
    calls = getattr(message, "tool_calls", None)
    if calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in calls
        ]
    if message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") for p in content]
    return "".join(str(p) for p in parts)
