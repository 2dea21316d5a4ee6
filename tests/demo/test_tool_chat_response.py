"""builtin:tool-arith's tokenizer reads its own assistant turns back (`response_template`), as
transformers' `parse_response` and so TRL's GRPOTrainer with tools read a generated turn: the tool
calls the chat template rendered come back with the same names and arguments, a plain answer as
the content."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.demo import tool_chat
from scalerl.demo.tool_task import tokenizer_texts

TOOLS = [
    {"type": "function", "function": {"name": "calculate", "description": "", "parameters": {}}}
]
MESSAGES = [
    {"role": "system", "content": "Reply with the number only."},
    {"role": "user", "content": "What is 37*48?"},
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tool_chat.build_tokenizer(tokenizer_texts(), merges=120)


def generated(tokenizer: Any, reply: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(context ids, the reply's ids) as the model would have seen and written them."""
    prefix = tokenizer.apply_chat_template(
        MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    whole = tokenizer.apply_chat_template([*MESSAGES, reply], tools=TOOLS, tokenize=False)
    assert whole.startswith(prefix)  # the template only appends
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    return encode(prefix), encode(whole[len(prefix) :])


names = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
values = st.one_of(st.integers(-999, 999), st.text("0123456789+-*/() ", max_size=12))
arguments = st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), values, max_size=3)


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(st.tuples(names, arguments), min_size=1, max_size=3))
def test_tool_calls_come_back_with_their_names_and_arguments(
    tokenizer: Any, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            tool_chat.tool_call_message(name, args, f"call-{i}")["tool_calls"][0]
            for i, (name, args) in enumerate(calls)
        ],
    }
    context, ids = generated(tokenizer, reply)
    parsed = tokenizer.parse_response(ids, prefix=context)
    assert parsed["role"] == "assistant"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed["tool_calls"]] == [
        (name, args) for name, args in calls
    ]
    assert all(c["type"] == "function" for c in parsed["tool_calls"])
    assert not parsed.get("content")


@settings(max_examples=40, deadline=None)
@given(answer=st.text("0123456789 abc", min_size=1, max_size=10).filter(str.strip))
def test_a_plain_answer_is_the_content(tokenizer: Any, answer: str) -> None:
    context, ids = generated(tokenizer, {"role": "assistant", "content": answer})
    parsed = tokenizer.parse_response(ids, prefix=context)
    # transformers' text parser strips the surrounding whitespace (the rubric strips it too).
    assert parsed == {"role": "assistant", "content": answer.strip()}


def test_the_template_is_saved_with_the_tokenizer(tokenizer: Any, tmp_path: Any) -> None:
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(str(tmp_path))
    assert AutoTokenizer.from_pretrained(str(tmp_path)).response_template == (
        tool_chat.RESPONSE_TEMPLATE
    )


def test_a_new_tokenizer_is_a_new_cache_entry() -> None:
    from scalerl.demo.tool_arith import ToolArithParams

    assert ToolArithParams.VERSION >= 2  # the version that added response_template
    assert ToolArithParams().key() != ToolArithParams(seed=1).key()
