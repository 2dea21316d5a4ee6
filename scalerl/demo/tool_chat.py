"""The tool-calling chat format of `builtin:tool-arith`: its tokenizer and chat template.

A byte-level BPE tokenizer like chat-arith's (scalerl.demo.bpe), with a fourth role, `tool`, and a
template that renders HF-standard tool calls and tool results:

- every turn is `<|role|>\\ncontent<|end|>\\n`; the generation prompt is `<|assistant|>\\n`, and
  the model ends its turn with `<|end|>` (generation_config.json lists it as EOS);
- given `tools`, the system turn gets one more line, `Tools: name1, name2` (names only: the
  model's context is small); with tools and no system message, that line is a system turn alone;
- an assistant message renders its content, then per tool call
  `<tool_call>{"name": "NAME", "arguments": ARGUMENTS}</tool_call>` with ARGUMENTS the call's
  `arguments` string as-is (a dict is written as JSON), so a call the model wrote as
  `json.dumps({"name": n, "arguments": a})` between the tags renders back to the very same text;
- `<tool_call>` and `</tool_call>` are single tokens but not special, so they survive
  `decode(..., skip_special_tokens=True)`; `<|tool|>` is special like the other role tokens;
- the tokenizer's `response_template` (`RESPONSE_TEMPLATE`) parses a generated assistant turn back
  into an HF message with `tool_calls`, as TRL's `GRPOTrainer` does with tools.

The template only appends: a conversation's rendering is a prefix of the rendering of any
conversation that continues it, which is what lets a multi-turn rollout keep one token sequence.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from scalerl.demo import bpe

# transformers is imported where the tokenizer is built: the tags and parsers here are read by
# modules that must stay light (a cached built-in's resolution imports this one).
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

TOOL_ROLE = "<|tool|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
ROLES = ("system", "user", "assistant", "tool")

CHAT_TEMPLATE = (
    "{%- set ns = namespace(names=[]) -%}"
    "{%- for tool in (tools or []) -%}"
    "{%- set ns.names = ns.names + [tool['function']['name'] if tool['function'] is defined"
    " else tool['name']] -%}"
    "{%- endfor -%}"
    "{%- set tool_line = 'Tools: ' + ns.names | join(', ') if ns.names else '' -%}"
    "{%- if tool_line and (not messages or messages[0]['role'] != 'system') -%}"
    "{{- '<|system|>\\n' + tool_line + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('unknown chat role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is defined and message['content'] is not none -%}"
    "{{- raise_exception('message content must be text, in a ' + message['role'] + ' turn') -}}"
    "{%- endif -%}"
    "{%- if loop.first and message['role'] == 'system' and tool_line -%}"
    "{{- '\\n' + tool_line -}}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined"
    " and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{%- set args = fn['arguments'] if fn['arguments'] is string else fn['arguments'] | tojson -%}"
    "{{- '<tool_call>{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + args + '}</tool_call>' -}}"  # noqa: E501
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)
GENERATION_PROMPT = bpe.GENERATION_PROMPT

# How transformers (>= 5.13, `tokenizer.parse_response`) and so TRL's tool loop read an assistant
# turn of this format back into a message: the text after the last generation prompt, each
# `<tool_call>` body parsed as JSON into an HF tool call, the rest up to `<|end|>` as content.
RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": GENERATION_PROMPT,
    "fields": {
        "tool_calls": {
            "open": TOOL_CALL_OPEN,
            "close": TOOL_CALL_CLOSE,
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        # The turn's end and the newline after it (a close pattern: a literal leaves it open).
        "content": {"close_pattern": re.escape(bpe.END) + r"\s*", "content": "text"},
    },
}


def tool_call_text(name: str, arguments: str) -> str:
    """What the model writes to call `name`: the text the template renders for that call."""
    return f'{TOOL_CALL_OPEN}{{"name": "{name}", "arguments": {arguments}}}{TOOL_CALL_CLOSE}'


def tool_call_message(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    """An HF-standard assistant message that calls one tool (no text before the call)."""
    call = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": call}],
    }


def parse_tool_calls(text: str) -> list[tuple[str, str]] | None:
    """The (name, arguments JSON) of each `<tool_call>` in a completion's text; None when the
    text has no tool call; a call whose JSON is broken gives ("", the raw text between tags).

    The JSON is read as JSON, not cut at the next tag: an argument whose text holds
    `</tool_call>` or `<tool_call>` is part of its call."""
    if TOOL_CALL_OPEN not in text:
        return None
    calls: list[tuple[str, str]] = []
    at = text.find(TOOL_CALL_OPEN)
    while at >= 0:
        start = at + len(TOOL_CALL_OPEN)
        call, end = _call_at(text, start)
        if call is None:
            close = text.find(TOOL_CALL_CLOSE, start)
            following = text.find(TOOL_CALL_OPEN, start)
            end = min(i for i in (close, following, len(text)) if i >= 0)
            call = ("", text[start:end])
        calls.append(call)
        at = text.find(TOOL_CALL_OPEN, end)
    return calls


def _call_at(text: str, start: int) -> tuple[tuple[str, str] | None, int]:
    """The call whose JSON starts at `start` (after blanks) and ends at a closing tag, the next
    call or the text's end; and where it ends."""
    begin = len(text) - len(text[start:].lstrip())
    try:
        parsed, end = json.JSONDecoder().raw_decode(text, begin)
        call = (str(parsed["name"]), json.dumps(parsed["arguments"]))
    except (ValueError, KeyError, TypeError):
        return None, start
    rest = text[end:].lstrip()
    if rest and not rest.startswith((TOOL_CALL_CLOSE, TOOL_CALL_OPEN)):
        return None, start
    return call, end


def build_tokenizer(texts: Iterable[str], merges: int) -> PreTrainedTokenizerFast:
    """chat-arith's byte-level BPE (merges learned from `texts`) with the `tool` role and the
    tool-call tags added, and this module's chat template."""
    from transformers import AddedToken

    tokenizer = bpe.build_tokenizer(texts, merges=merges)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [bpe.END, *bpe.ROLE_TOKENS, TOOL_ROLE]},
        replace_extra_special_tokens=True,
    )
    tokenizer.add_tokens(
        [
            AddedToken(tag, normalized=False, special=False)
            for tag in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
        ]
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer
