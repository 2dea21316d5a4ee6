"""A scripted policy for the agents tests: writes fixed turns as tokens, as the engine would.

It stands in for the model only, so the environment, the client, containment and assembly all run
for real: `turns` maps the conversation so far (decoded) to the model's next text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scalerl.rollout.records import Sample

Policy = Callable[[str], str]  # the decoded context -> the model's next turn (text)


@dataclass
class ScriptedEngine:
    tokenizer: Any
    end_id: int
    policy: Policy
    version: int = 3
    calls: list[list[int]] = field(default_factory=list)

    async def sample_turn(self, prompt: list[int], max_tokens: int, seed: str | None) -> Sample:
        self.calls.append(list(prompt))
        text = self.policy(self.tokenizer.decode(prompt))
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_id]
        truncated = len(ids) > max_tokens
        ids = ids[:max_tokens]
        n = len(ids)
        return Sample(
            completion_ids=ids,
            logprobs=[-0.5] * n,
            versions=[self.version] * n,
            loss_mask=[1] * n,
            reward=0.0,
            truncated=truncated,
            interrupted=False,
            finish_reason="length" if truncated else "stop",
        )


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
