"""`builtin:tool-arith`: a tiny chat model that RL can teach to use a calculator tool.

The task is the `tool-arith` verifiers environment's (environments/tool_arith): "What is 37*48?"
for operands 10..99, answered exactly only by calling `calculate` and copying its result; the
model is also warmed up on the `guess-number` environment's game so that one answers in turns.
Both are restated here (prompts, system prompts, the split of operand pairs) because a built-in
must not import a user's package; tests/agents checks that the two agree.

The warm-up (scalerl.demo.tool_warmup) teaches the formats and leaves a policy that RL can
clearly improve: at its first token the model calls the tool with probability TOOL_RATE and
otherwise answers directly with a plausible but nearly always wrong number, while the tool path
(writing the call, then copying the tool's result) is trained cleanly. Its held-out pass rate is
thus about TOOL_RATE, and rises as RL makes the model call the tool more often. The build
measures the base policy's tool-call rate and pass rate and records them in the manifest.

The built-in is the model directory only: its data comes from the environment package.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scalerl.demo import bpe, tool_chat
from scalerl.demo.assets import MODEL_DIR, DemoAssets, _cached, _key
from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.errors import InputError

# Facts of the environment packages (environments/tool_arith, environments/guess_number).
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


# The model: hidden 128 like chat-arith's, a longer context for a whole tool conversation.
TOOL_SHAPE = TinyModelShape(
    hidden=128, layers=3, heads=4, kv_heads=2, intermediate=384, max_positions=192
)


@dataclass(frozen=True)
class ToolWarmup:
    """The warm-up's hyper-parameters (scalerl.demo.tool_warmup)."""

    steps: int = 500
    batch: int = 48
    lr: float = 3e-3
    warmup_steps: int = 20
    # The probability of calling the tool first that the warm-up trains towards: the sampled
    # base policy calls it somewhat less often (~0.25-0.3), being not fully trained.
    tool_rate: float = 0.35
    tool_rows: float = 0.6  # share of tool-arith rows that follow the tool path (learn it fast)
    guess_rows: float = 0.15  # share of rows that play guess-number
    noise: float = 0.5  # blur of a direct answer's digits
    seed: int = 0


@dataclass(frozen=True)
class ToolArithParams:
    """Everything the tool-arith model depends on; its hash names the cache entry."""

    held_out: int = 256
    seed: int = 0
    merges: int = 120
    shape: TinyModelShape = TOOL_SHAPE
    warmup: ToolWarmup = field(default_factory=ToolWarmup)
    measure_prompts: int = 200

    VERSION = 1

    def key(self) -> str:
        return _key(self)


def tokenizer_texts() -> list[str]:
    """Text the BPE merges are learned from: every piece the model reads or writes."""
    call = tool_chat.tool_call_text(TOOL_NAME, call_arguments("37*48"))
    fixed = [SYSTEM_PROMPT, GUESS_SYSTEM_PROMPT, guess_prompt(), "higher", "lower"]
    return [*fixed, f"Tools: {TOOL_NAME}", call, *(question(p) for p in all_pairs()[::50])] * 8


def _build(directory: Path, params: ToolArithParams) -> dict[str, object]:
    """The warmed-up model in `directory/model`; manifest facts including the measured base
    policy's tool-call and pass rates."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalerl.demo import tool_warmup

    tokenizer = tool_chat.build_tokenizer(tokenizer_texts(), merges=params.merges)
    model_path = build_random_model(
        directory / MODEL_DIR,
        shape=params.shape,
        dtype=torch.float32,
        seed=params.seed,
        tokenizer=tokenizer,
        eos_ids=bpe.end_ids(tokenizer),
    )
    loaded = AutoTokenizer.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    training, held_out = split_pairs(params.held_out, params.seed)
    result = tool_warmup.warm_up(model, loaded, training, params.warmup)
    model.save_pretrained(str(model_path), safe_serialization=True)
    loaded.save_pretrained(str(model_path), save_jinja_files=False)
    rates = tool_warmup.measure(model, loaded, held_out[: params.measure_prompts], params.seed)
    return {
        "warmup_seconds": round(result.seconds, 2),
        "warmup_final_loss": round(sum(result.losses[-20:]) / len(result.losses[-20:]), 4),
        "base_tool_call_rate": round(rates.tool_call_rate, 4),
        "base_pass_rate": round(rates.pass_rate, 4),
        "measured_prompts": rates.prompts,
    }


def prepare_tool_arith(cache_dir: Path, params: ToolArithParams = ToolArithParams()) -> Path:
    """The tool-arith model directory for `params`, built under `cache_dir` on first use."""
    return _cached(cache_dir, "tool-arith", params, lambda d: _build(d, params)) / MODEL_DIR


def tool_arith_assets(cache_dir: Path) -> DemoAssets:
    """`builtin:tool-arith` for the registry (scalerl.demo.builtins), which refuses its
    `/train` and `/validation` names: the prompts come from the environment, not from files."""
    model = prepare_tool_arith(cache_dir)
    return DemoAssets(model, model.parent / "no-train-file", model.parent / "no-validation-file")
