"""Tool calls in a model's text: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

The Hermes format most open chat models (Qwen 2.5/3, Hermes, the built-in tool-arith) are trained
on and vLLM's `hermes` parser reads. The arguments keep the model's own JSON text where it can be
cut out whole, so a chat template that prints them back re-renders what the model wrote (and the
conversation keeps its prefix); a block that is not JSON with a name stays in the text, where
the environment reads it as the model wrote it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside well-formed calls, the calls in order)."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1))
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    return "".join(kept).strip(), calls


def _call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        return ToolCall(value["name"], arguments)
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], _own_text(body, arguments))


def _own_text(body: str, arguments: dict[str, object]) -> str:
    """The arguments object as the model wrote it, where it is one piece of the block's text."""
    written = json.dumps(arguments)
    start = body.find('"arguments"')
    if start >= 0:
        brace = body.find("{", start)
        decoder = json.JSONDecoder()
        try:
            value, end = decoder.raw_decode(body, brace)
        except (json.JSONDecodeError, ValueError):
            return written
        if value == arguments:
            return body[brace:end]
    return written
