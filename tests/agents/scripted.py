"""A scripted policy for the agents tests: writes fixed turns as tokens, as the engine would.

It stands in for the model only, so the environment, the client, containment and assembly all run
for real: `turns` maps the conversation so far (decoded) to the model's next text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scalerl.generator.length import Allowance, LengthControl, Segment
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.rollout.records import Sample

Policy = Callable[[str], str]  # the decoded context -> the model's next turn (text)


@dataclass
class ScriptedEngine:
    """Samples each turn under the real length rules (`LengthControl`): a request writes the
    scripted turn's next tokens; after an injected phrase, the turn's answer (what follows its
    `</think>`)."""

    tokenizer: Any
    end_id: int
    policy: Policy
    length: LengthControl
    version: int = 3
    calls: list[list[int]] = field(default_factory=list)

    async def sample_turn(self, prompt: list[int], left: Allowance, seed: str | None) -> Sample:
        self.calls.append(list(prompt))
        text = self.policy(self.tokenizer.decode(prompt))
        turn = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_id]

        async def request(context: list[int], max_tokens: int, stops: Sequence[int]) -> Segment:
            so_far = context[len(prompt) :]
            if turn[: len(so_far)] == so_far:
                rest = turn[len(so_far) :]
            else:  # interrupted: the phrase took the thinking's place
                rest = self._answer_of(turn)
            ids = rest[:max_tokens]
            ends = [k for k, t in enumerate(ids) if t in stops]
            if ends:
                ids = ids[: ends[0] + 1]
            n = len(ids)
            finish = "stop" if ends else "length"
            return Segment(ids, [-0.5] * n, [self.version] * n, finish)

        return await self.length.sample(
            request, prompt, left.thinking, lambda: self.version, answer_budget=left.answer
        )

    def _answer_of(self, turn: list[int]) -> list[int]:
        end = self.length.think_end_id
        return turn[turn.index(end) + 1 :] if end in turn else turn


def length_rules(
    tokenizer: Any,
    end_id: int,
    *,
    answer_budget: int = 256,
    thinking_budget: int = 64,
    window: tuple[int, int] | None = None,
    thinks: bool = False,
) -> LengthControl:
    """The recipe's length rules for a chat tokenizer of tests/agents/chat_models; `thinks`:
    `</think>` ends thinking, and the interruption phrase is injected at a cutoff in `window`
    (None: interruption disabled)."""
    plan = InterruptionPlan(
        thinking_budget=thinking_budget,
        answer_budget=answer_budget,
        window=window or (thinking_budget, thinking_budget),
        enabled=window is not None,
    )
    think_end = int(tokenizer.convert_tokens_to_ids("</think>")) if thinks else None
    phrase = tokenizer.encode(" Time is up.</think>", add_special_tokens=False) if thinks else []
    return LengthControl(plan, think_end, tuple(phrase), max_model_len=4096, eos_ids=(end_id,))


def calculator_policy(context: str) -> str:
    """Calls the tool on the question's expression, then answers what the tool said."""
    tail = context.rsplit("<|tool|>\n", 1)
    if len(tail) == 2:
        return tail[1].split("<|end|>", 1)[0]
    expression = context.rsplit("What is ", 1)[1].split("?", 1)[0]
    return tool_call("calculate", {"expression": expression})


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as a Hermes-format model writes it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def scripted_response(reply: dict[str, Any], model: str, call_prefix: str) -> Any:
    """A scripted model turn as verifiers' client returns it: `reply` is {"content": text,
    "calls": [(name, arguments JSON), ...]}."""
    from verifiers.types import Response, ResponseMessage, ToolCall

    calls = [
        ToolCall(id=f"{call_prefix}{k}", name=name, arguments=arguments)
        for k, (name, arguments) in enumerate(reply.get("calls", []))
    ]
    message = ResponseMessage(
        content=reply.get("content"),
        tool_calls=calls or None,
        finish_reason="tool_calls" if calls else "stop",
        is_truncated=False,
    )
    return Response(id="scripted", created=0, model=model, message=message)
