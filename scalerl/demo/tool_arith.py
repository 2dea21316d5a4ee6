"""`builtin:tool-arith`: a tiny chat model that RL can teach to use a calculator tool.

The task is the `tool-arith` verifiers environment's (environments/tool_arith): "What is 37*48?"
for operands 10..99, answered exactly only by calling `calculate` and copying its result; the
model is also warmed up on the `guess-number` environment's game so that one answers in turns.
scalerl.demo.tool_task restates both (a built-in must not import a user's package).

The warm-up (scalerl.demo.tool_warmup) teaches the formats and leaves a policy that RL can
clearly improve: at its first token the model calls the tool with probability about
`ToolWarmup.tool_rate` and otherwise answers directly with a plausible but nearly always wrong
number, while the tool path (writing the call, then copying the tool's result) is trained
cleanly. Its held-out pass rate is thus somewhat below its tool-call rate (~0.3), and rises as
RL makes the model call the tool more often. The build measures the base policy's tool-call
rate and pass rate (`base_tool_call_rate`, `base_pass_rate`) and records them in the manifest.

The built-in is the model directory only: its data comes from the environment package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from scalerl.demo import bpe, tool_chat, tool_warmup
from scalerl.demo.assets import MODEL_DIR, DemoAssets, _cached, _key
from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.demo.tool_task import split_pairs, tokenizer_texts
from scalerl.demo.tool_warmup import ToolWarmup

# The model: hidden 128 like chat-arith's, a longer context for a whole tool conversation, and
# two layers, enough to copy (a third learned no better in the same steps and cost 1.5x).
TOOL_SHAPE = TinyModelShape(
    hidden=128, layers=2, heads=4, kv_heads=2, intermediate=384, max_positions=192
)


@dataclass(frozen=True)
class ToolArithParams:
    """Everything the tool-arith model depends on; its hash names the cache entry."""

    held_out: int = 256
    seed: int = 0
    merges: int = 120
    shape: TinyModelShape = TOOL_SHAPE
    warmup: ToolWarmup = field(default_factory=ToolWarmup)
    measure_prompts: int = 200

    VERSION = 2  # 2: the tokenizer has a response_template (scalerl.demo.tool_chat)

    def key(self) -> str:
        return _key(self)


def _build(directory: Path, params: ToolArithParams) -> dict[str, object]:
    """The warmed-up model in `directory/model`; manifest facts including the measured base
    policy's tool-call and pass rates."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = tool_chat.build_tokenizer(tokenizer_texts(), merges=params.merges)
    model_path = build_random_model(
        directory / MODEL_DIR,
        shape=params.shape,
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
