"""The tool-arith task as `builtin:tool-arith` is warmed up on it: the prompts, system prompts,
tool and operand pairs of the `tool-arith` and `guess-number` verifiers environments
(environments/), restated here because a built-in must not import a user's package;
tests/agents checks that the two agree.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from scalerl.demo import tool_chat
from scalerl.errors import InputError

SYSTEM_PROMPT = "Reply with the number only."
TOOL_NAME = "calculate"
LOW, HIGH = 10, 99
GUESS_SYSTEM_PROMPT = "Reply with one number."
GUESS_HIGH = 8
DIGITS = "0123456789"
PRODUCT = re.compile(r"^\s*(\d+)\s*\*\s*(\d+)\s*$")

Message = dict[str, Any]
Pair = tuple[int, int]


def question(pair: Pair) -> str:
    return f"What is {pair[0]}*{pair[1]}?"


def guess_prompt(high: int = GUESS_HIGH) -> str:
    return f"Guess the number from 1 to {high}."


def tool_defs() -> list[dict[str, Any]]:
    """The calculator as HF's `tools` argument describes it (the template shows names only)."""
    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}}
    function = {"name": TOOL_NAME, "description": "Evaluate arithmetic.", "parameters": parameters}
    return [{"type": "function", "function": function}]


def prompt_messages(pair: Pair) -> list[Message]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": question(pair)},
    ]


def guess_messages(high: int = GUESS_HIGH) -> list[Message]:
    return [
        {"role": "system", "content": GUESS_SYSTEM_PROMPT},
        {"role": "user", "content": guess_prompt(high)},
    ]


def call_arguments(expression: str) -> str:
    return json.dumps({"expression": expression})


def product_tool(expression: str) -> str:
    """The calculator for what this task's model writes, a product of two whole numbers; anything
    else is answered as the environment's calculator answers an expression it rejects."""
    match = PRODUCT.match(expression)
    if match is None:
        return f"unsupported expression {expression!r}"
    return str(int(match[1]) * int(match[2]))


def _pairs(count: int, used: set[Pair], rng: random.Random) -> list[Pair]:
    """`count` unordered operand pairs not in `used` (updated in place), each in random order:
    the environment's own draw, so the same seed gives the same pairs."""
    drawn: list[Pair] = []
    while len(drawn) < count:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        key = (min(a, b), max(a, b))
        if key not in used:
            used.add(key)
            drawn.append((a, b))
    return drawn


def all_pairs() -> list[Pair]:
    return [(a, b) for a in range(LOW, HIGH + 1) for b in range(a, HIGH + 1)]


def split_pairs(held_out: int, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(warm-up pairs, held-out pairs): the held-out ones are the environment's eval split for
    `num_eval=held_out` (and its first 128 those of the default `num_eval`); the warm-up gets
    every other unordered pair."""
    if not 1 <= held_out < len(all_pairs()):
        raise InputError(f"held_out must be in 1..{len(all_pairs()) - 1}, got {held_out}")
    used: set[Pair] = set()
    evaluation = _pairs(held_out, used, random.Random(seed))
    rng = random.Random(seed + 1)
    training = [p if rng.random() < 0.5 else (p[1], p[0]) for p in all_pairs() if p not in used]
    return training, evaluation


def tokenizer_texts() -> list[str]:
    """Text the BPE merges are learned from: every piece the model reads or writes."""
    call = tool_chat.tool_call_text(TOOL_NAME, call_arguments("37*48"))
    fixed = [SYSTEM_PROMPT, GUESS_SYSTEM_PROMPT, guess_prompt(), "higher", "lower"]
    return [*fixed, f"Tools: {TOOL_NAME}", call, *(question(p) for p in all_pairs()[::50])] * 8
