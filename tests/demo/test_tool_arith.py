"""`builtin:tool-arith`: the tool-calling chat format its rollouts rely on, the warm-up's rows,
and the base policy it leaves, measured here by sampling it as a user would."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
)

from scalerl.demo import bpe, tool_chat, tool_task, tool_warmup
from scalerl.demo.assets import default_cache_dir
from scalerl.demo.builtins import known_names, resolve_builtin
from scalerl.demo.model import TinyModelShape
from scalerl.demo.tool_arith import ToolArithParams, prepare_tool_arith
from scalerl.demo.tool_warmup import ToolWarmup
from scalerl.errors import DataError

QUICK = ToolArithParams(
    shape=TinyModelShape(hidden=32, layers=1, heads=1, intermediate=64, max_positions=192),
    warmup=ToolWarmup(steps=2, batch=8, warmup_steps=1),
    measure_prompts=4,
)
TOOLS = tool_task.tool_defs()
SYSTEM = {"role": "system", "content": tool_task.SYSTEM_PROMPT}
USER = {"role": "user", "content": "What is 37*48?"}
CALL = tool_chat.tool_call_message("calculate", {"expression": "37*48"}, "call_0")
RESULT = {"role": "tool", "tool_call_id": "call_0", "content": "1776"}
ANSWER = {"role": "assistant", "content": "1776"}


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return tool_chat.build_tokenizer(tool_task.tokenizer_texts(), merges=120)


def render(
    tokenizer: PreTrainedTokenizerFast,
    messages: list[dict[str, Any]],
    tools: Any = TOOLS,
    **kwargs: Any,
) -> str:
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
    assert isinstance(text, str)
    return text


def ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False).input_ids)


# --- the chat template ---------------------------------------------------------------------------


def test_a_tool_conversation_renders_turn_by_turn(tokenizer: PreTrainedTokenizerFast) -> None:
    assert render(tokenizer, [SYSTEM, USER, CALL, RESULT, ANSWER]) == (
        "<|system|>\nReply with the number only.\nTools: calculate<|end|>\n"
        "<|user|>\nWhat is 37*48?<|end|>\n"
        '<|assistant|>\n<tool_call>{"name": "calculate", "arguments": {"expression": "37*48"}}'
        "</tool_call><|end|>\n"
        "<|tool|>\n1776<|end|>\n"
        "<|assistant|>\n1776<|end|>\n"
    )


def test_the_tools_line_needs_tools_and_stands_alone_without_a_system_turn(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    plain = tokenizer.apply_chat_template(
        [SYSTEM, USER], tokenize=False, add_generation_prompt=True
    )
    assert (
        plain == f"<|system|>\n{tool_task.SYSTEM_PROMPT}<|end|>\n"
        "<|user|>\nWhat is 37*48?<|end|>\n<|assistant|>\n"
    )
    two = [*TOOLS, {"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    alone = tokenizer.apply_chat_template([USER], tools=two, tokenize=False)
    assert alone == "<|system|>\nTools: calculate, lookup<|end|>\n<|user|>\nWhat is 37*48?<|end|>\n"


def test_content_before_calls_and_several_calls_render_in_order(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    message = {
        "role": "assistant",
        "content": "Let me see.",
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "calculate", "arguments": '{"expression": "1+1"}'},
            },
            {
                "id": "b",
                "type": "function",
                "function": {"name": "calculate", "arguments": {"expression": "2"}},
            },
        ],
    }
    text = render(tokenizer, [message], tools=None)
    assert text == (
        "<|assistant|>\nLet me see."
        '<tool_call>{"name": "calculate", "arguments": {"expression": "1+1"}}</tool_call>'
        '<tool_call>{"name": "calculate", "arguments": {"expression": "2"}}</tool_call><|end|>\n'
    )


def test_unknown_roles_and_non_text_content_are_refused(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(Exception, match="unknown chat role: ipython"):
        render(tokenizer, [{"role": "ipython", "content": "x"}])
    with pytest.raises(Exception, match="content must be text, in a user turn"):
        render(tokenizer, [{"role": "user", "content": [{"type": "image"}]}])


def test_tags_and_roles_are_single_tokens_and_the_tags_survive_decoding(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    for token in (
        tool_chat.TOOL_CALL_OPEN,
        tool_chat.TOOL_CALL_CLOSE,
        tool_chat.TOOL_ROLE,
        bpe.END,
    ):
        assert len(ids(tokenizer, token)) == 1, token
    assert tool_chat.TOOL_ROLE in tokenizer.all_special_tokens
    assert tool_chat.TOOL_CALL_OPEN not in tokenizer.all_special_tokens
    call = ids(tokenizer, tokenizer.apply_chat_template([CALL], tokenize=False))
    decoded = tokenizer.decode(call, skip_special_tokens=True)
    assert (
        decoded
        == '\n<tool_call>{"name": "calculate", "arguments": {"expression": "37*48"}}</tool_call>\n'
    )


@settings(max_examples=150)
@example(name="_", arguments={"a": "</tool_call>"})  # an argument holding a tag (hypothesis)
@example(name="_", arguments={"a": "<tool_call>"})
@given(
    name=st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
    arguments=st.dictionaries(
        st.from_regex(r"[a-z]{1,6}", fullmatch=True),
        st.text(max_size=12) | st.integers(),
        max_size=3,
    ),
)
def test_a_call_the_model_wrote_renders_back_to_its_own_text(
    tokenizer: PreTrainedTokenizerFast, name: str, arguments: dict[str, Any]
) -> None:
    written = f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
    ((parsed_name, parsed_arguments),) = tool_chat.parse_tool_calls(written) or []
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c",
                "type": "function",
                "function": {"name": parsed_name, "arguments": parsed_arguments},
            }
        ],
    }
    assert render(tokenizer, [message], tools=None) == f"<|assistant|>\n{written}<|end|>\n"


TURNS = st.lists(
    st.sampled_from(["user", "call", "tool", "answer"]).map(
        lambda kind: {"user": USER, "call": CALL, "tool": RESULT, "answer": ANSWER}[kind]
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=150)
@given(turns=TURNS, cut=st.integers(1, 7), system=st.booleans())
def test_rendering_only_appends(
    tokenizer: PreTrainedTokenizerFast, turns: list[dict[str, Any]], cut: int, system: bool
) -> None:
    """A conversation's tokens are a prefix of its continuation's, generation prompt included:
    the tokens a rollout sampled stay exactly where they were when a tool turn is added."""
    messages = [SYSTEM, *turns] if system else turns
    head = messages[: min(cut, len(messages))]
    whole = ids(tokenizer, render(tokenizer, messages, add_generation_prompt=True))
    assert whole[: len(ids(tokenizer, render(tokenizer, head)))] == ids(
        tokenizer, render(tokenizer, head)
    )
    if len(head) > 1 and head[-1]["role"] == "assistant":
        asked = ids(tokenizer, render(tokenizer, head[:-1], add_generation_prompt=True))
        answered = ids(tokenizer, render(tokenizer, head))
        assert answered[: len(asked)] == asked


def test_an_assistant_turn_then_a_tool_turn_keeps_the_sampled_tokens(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    before = ids(tokenizer, render(tokenizer, [SYSTEM, USER, CALL]))
    after = ids(
        tokenizer, render(tokenizer, [SYSTEM, USER, CALL, RESULT], add_generation_prompt=True)
    )
    assert after[: len(before)] == before
    assert tokenizer.decode(after[len(before) :]) == "<|tool|>\n1776<|end|>\n<|assistant|>\n"


# --- the warm-up's rows --------------------------------------------------------------------------


@settings(max_examples=60)
@given(
    a=st.integers(10, 99), b=st.integers(10, 99), use_tool=st.booleans(), seed=st.integers(0, 99)
)
def test_warmup_rows_are_the_templates_tokens_trained_on_the_models_turns(
    tokenizer: PreTrainedTokenizerFast, a: int, b: int, use_tool: bool, seed: int
) -> None:
    encoder = tool_warmup.Encoder(tokenizer, ToolWarmup())
    row = encoder.arith((a, b), use_tool, random.Random(seed))
    text = tokenizer.decode(row.ids)
    messages = re.findall(r"<\|(\w+)\|>\n(.*?)<\|end\|>\n", text, flags=re.S)
    chat: list[dict[str, Any]] = [{"role": r, "content": c} for r, c in messages]
    chat[0]["content"] = tool_task.SYSTEM_PROMPT  # the template adds the tools line itself
    assert row.ids == ids(tokenizer, render(tokenizer, chat))
    trained = [t for t, target in zip(row.ids, row.targets, strict=True) if target is not None]
    spans = "".join(f"{c}<|end|>" for r, c in messages if r == "assistant")
    assert tokenizer.decode(trained) == spans
    if use_tool:
        assert (
            spans
            == tool_chat.tool_call_text("calculate", json.dumps({"expression": f"{a}*{b}"}))
            + f"<|end|>{a * b}<|end|>"
        )


def test_the_first_answer_token_is_trained_to_call_the_tool_at_the_set_rate(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    config = ToolWarmup(tool_rate=0.3, noise=0.5)
    encoder = tool_warmup.Encoder(tokenizer, config)
    row = encoder.arith((37, 48), False, random.Random(0))
    first = next(target for target in row.targets if target is not None)
    assert first[ids(tokenizer, "<tool_call>")[0]] == pytest.approx(0.3)
    assert first[ids(tokenizer, "1")[0]] == pytest.approx(0.7 * (0.5 + 0.05))  # 1776 starts with 1
    assert sum(first.values()) == pytest.approx(1.0)


def test_a_guess_game_row_guesses_uniformly_and_hears_hints(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    encoder = tool_warmup.Encoder(tokenizer, ToolWarmup())
    row = encoder.guess(random.Random(1), high=8, max_turns=4)
    text = tokenizer.decode(row.ids)
    assert text.startswith(
        "<|system|>\nReply with one number.<|end|>\n"
        "<|user|>\nGuess the number from 1 to 8.<|end|>\n"
    )
    guesses = [target for target in row.targets if target is not None and len(target) > 1]
    assert guesses and all(sorted(g.values()) == [0.125] * 8 for g in guesses)


# --- the cached build ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_tool_arith(tmp_path_factory.mktemp("cache"), QUICK)


def test_the_model_folder_ends_turns_with_end_and_keeps_the_template(quick: Path) -> None:
    loaded = AutoTokenizer.from_pretrained(str(quick))
    config = json.loads((quick / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tool_chat.CHAT_TEMPLATE
    generation = GenerationConfig.from_pretrained(str(quick))
    assert generation.eos_token_id == bpe.end_ids(loaded)
    assert generation.eos_token_id[0] == loaded.convert_tokens_to_ids("<|end|>")
    manifest = json.loads((quick.parent / "manifest.json").read_text())
    assert {"warmup_seconds", "base_tool_call_rate", "base_pass_rate"} <= set(manifest)
    assert manifest["measured_prompts"] == 4


def test_model_only_builtin_names() -> None:
    assert "builtin:tool-arith" in known_names()
    assert "builtin:tool-arith/train" not in known_names()
    with pytest.raises(DataError, match="tool-arith is a model only"):
        resolve_builtin("builtin:tool-arith/train")


# --- the real base model -------------------------------------------------------------------------

EXPRESSION = re.compile(
    r'^<tool_call>\{"name": "calculate", "arguments": '
    r'\{"expression": "(\d+)\*(\d+)"\}\}</tool_call>$'
)


def sample_turns(
    model: Any,
    tokenizer: Any,
    chats: list[list[dict[str, Any]]],
    tools: Any = TOOLS,
    prefix: str = "",
) -> list[str]:
    """One model turn per chat at temperature 1 (plain HF generate, left-padded batch), each
    decoded up to the first end token that generation_config.json names; `prefix` is imposed as
    the turn's first text."""
    contexts = [
        ids(tokenizer, render(tokenizer, chat, tools, add_generation_prompt=True) + prefix)
        for chat in chats
    ]
    width, pad = max(len(c) for c in contexts), tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    out = model.generate(
        input_ids=input_ids,
        attention_mask=(input_ids != pad).long(),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=40,
        pad_token_id=pad,
    )
    ends = GenerationConfig.from_pretrained(model.name_or_path).eos_token_id
    replies = []
    for completion in out[:, width:].tolist():
        stop = next((k for k, t in enumerate(completion) if t in ends), len(completion))
        replies.append(prefix + tokenizer.decode(completion[:stop], skip_special_tokens=True))
    return replies


def play(
    model: Any, tokenizer: Any, pairs: list[tuple[int, int]], force_tool: bool = False
) -> list[tuple[bool, bool]]:
    """(called the tool first, answered a*b) per pair, in conversations of at most four model
    turns as the ToolEnv plays them; the tool's results are computed here with Python ints.
    `force_tool`: every first turn starts with `<tool_call>`, as a policy that always calls."""
    chats = [[SYSTEM, {"role": "user", "content": f"What is {a}*{b}?"}] for a, b in pairs]
    called: set[int] = set()
    passed: dict[int, bool] = {}
    for turn in range(4):
        active = [i for i in range(len(pairs)) if i not in passed]
        if not active:
            break
        prefix = "<tool_call>" if force_tool and turn == 0 else ""
        replies = sample_turns(model, tokenizer, [chats[i] for i in active], prefix=prefix)
        for i, reply in zip(active, replies, strict=True):
            if "<tool_call>" not in reply:
                passed[i] = reply.strip() == str(pairs[i][0] * pairs[i][1])
                continue
            called |= {i} if turn == 0 else set()
            match = EXPRESSION.match(reply)
            result = str(int(match[1]) * int(match[2])) if match else "error"
            arguments = {"expression": f"{match[1]}*{match[2]}"} if match else {}
            chats[i] += [
                tool_chat.tool_call_message("calculate", arguments, f"c{turn}"),
                {"role": "tool", "tool_call_id": f"c{turn}", "content": result},
            ]
    return [(i in called, passed.get(i, False)) for i in range(len(pairs))]


@pytest.fixture(scope="session")
def tool_arith_model() -> Path:
    """The real model in the shared cache: only the first build pays (~2 min)."""
    return prepare_tool_arith(default_cache_dir())


def test_the_base_policy_calls_the_tool_sometimes_and_passes_about_as_often(
    tool_arith_model: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tool_arith_model))
    model = AutoModelForCausalLM.from_pretrained(str(tool_arith_model)).eval()
    _, held_out = tool_task.split_pairs(256, seed=0)
    torch.manual_seed(0)  # the seed the build measured with
    with torch.no_grad():
        results = play(model, tokenizer, held_out[:200])
    tool_rate = sum(c for c, _ in results) / len(results)
    pass_rate = sum(p for _, p in results) / len(results)
    assert 0.2 <= tool_rate <= 0.45, tool_rate
    assert 0.15 <= pass_rate <= 0.35, pass_rate
    # Nearly every pass comes through the tool: RL has one clear thing to learn.
    assert sum(p for c, p in results if not c) <= 3
    # What the manifest tells a user is what sampling the model shows.
    manifest = json.loads((tool_arith_model.parent / "manifest.json").read_text())
    assert manifest["measured_prompts"] == 200
    assert manifest["base_tool_call_rate"] == pytest.approx(tool_rate, abs=1e-4)
    assert manifest["base_pass_rate"] == pytest.approx(pass_rate, abs=1e-4)


def test_calling_the_tool_every_time_would_pass_far_more_often(tool_arith_model: Path) -> None:
    """The room RL has: the same model made to call the tool first on every prompt passes at
    least 0.3 more often than the base policy does (it then rarely miscopies)."""
    tokenizer = AutoTokenizer.from_pretrained(str(tool_arith_model))
    model = AutoModelForCausalLM.from_pretrained(str(tool_arith_model)).eval()
    _, held_out = tool_task.split_pairs(256, seed=0)
    torch.manual_seed(0)
    with torch.no_grad():
        base = play(model, tokenizer, held_out[:100])
        forced = play(model, tokenizer, held_out[:100], force_tool=True)
    base_rate = sum(p for _, p in base) / len(base)
    forced_rate = sum(p for _, p in forced) / len(forced)
    assert all(c for c, _ in forced)
    assert forced_rate >= base_rate + 0.3, (base_rate, forced_rate)  # 0.22 and 0.82 here


def test_the_base_policy_plays_guess_number_with_numbers(tool_arith_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tool_arith_model))
    model = AutoModelForCausalLM.from_pretrained(str(tool_arith_model)).eval()
    torch.manual_seed(0)
    game = [
        {"role": "system", "content": "Reply with one number."},
        {"role": "user", "content": "Guess the number from 1 to 8."},
    ]
    with torch.no_grad():
        replies = sample_turns(model, tokenizer, [game] * 100, tools=None)  # a game has no tools
    guesses = [int(r) for r in replies if r.isdigit() and 1 <= int(r) <= 8]
    assert len(guesses) >= 70, replies
    assert len(set(guesses)) == 8  # random guessing, every number tried


def test_the_builtin_name_resolves_to_the_cached_model(tool_arith_model: Path) -> None:
    assert resolve_builtin("builtin:tool-arith") == tool_arith_model
