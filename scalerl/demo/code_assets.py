"""`builtin:code`: the code task's data (scalerl.demo.code_task) and a tiny Llama warmed up to
write its programs, built once and cached like the other built-ins (scalerl.demo.assets).

The tokenizer is chat-arith's byte-level BPE (scalerl.demo.bpe) with merges learned from the
training rows: any text round-trips (newlines, tabs, any character a program may hold), a keyword
or name is one token (a program is some 20 tokens, where characters would be 50: cheaper warm-up
and RL steps), and every digit is a token of its own, so the warm-up can blur a constant's digits
without changing a program's length. It has no BOS. The model does not think and reads raw text:
the prompt is a comment line, the completion the program, ended by EOS (examples/code.yaml runs
it so: `thinkEnd: null`, no chat template).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scalerl.demo import bpe, code_task
from scalerl.demo.assets import DemoAssets, _cached, _key, _warm_and_save
from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.demo.warmup import Framing, WarmupConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

MODEL_DIR = "model"
# Enough for every keyword and name of the task's programs and prompts to be one token.
MERGES = 200

# The demo's shape: a program and its prompt are some 40 tokens, so far fewer positions.
CODE_SHAPE = TinyModelShape(max_positions=128)
# The blur on the digits leaves a held-out pass rate of ~0.25 (sampled at T=1).
CODE_WARMUP = WarmupConfig(steps=400, batch=64, lr=3e-3, noise=0.5)


@dataclass(frozen=True)
class CodeParams:
    """Everything the code assets depend on; its hash names the cache entry."""

    task: code_task.CodeTask = field(default_factory=code_task.CodeTask)
    merges: int = MERGES
    shape: TinyModelShape = CODE_SHAPE
    warmup: WarmupConfig = CODE_WARMUP

    VERSION = 1  # bump when the build's code changes what it produces

    def key(self) -> str:
        return _key(self)


def build_tokenizer(rows: list[code_task.Row], merges: int = MERGES) -> PreTrainedTokenizerFast:
    """Byte-level BPE learned from the training rows' prompts and programs (digits stay one
    token each, so the warm-up can blur a constant's digits one by one)."""
    return bpe.build_tokenizer([row["prompt"] + row["solution"] for row in rows], merges=merges)


def code_framing(tokenizer: Any) -> Framing:
    """How examples/code.yaml runs the model: the raw prompt (the tokenizer has no BOS), no
    thinking, its EOS at the end."""
    return Framing(tokenizer, tokenizer.eos_token_id, think_end=None)


def _build(directory: Path, params: CodeParams) -> dict[str, object]:
    """Write the code task's data and warmed-up model into `directory`; return manifest facts."""
    train_path, _ = code_task.write_task(directory, params.task)
    # Only training problems, for the tokenizer as for the model: the held-out ones stay unseen.
    rows = code_task.read_rows(train_path)
    model_path = build_random_model(
        directory / MODEL_DIR,
        shape=params.shape,
        seed=params.task.seed,
        tokenizer=build_tokenizer(rows, params.merges),
    )
    examples = [(row["prompt"], row["solution"]) for row in rows]
    return _warm_and_save(model_path, code_framing, examples, code_task.DIGITS, params.warmup)


def prepare_code(cache_dir: Path, params: CodeParams = CodeParams()) -> DemoAssets:
    """The code task's JSONL data and base model for `params`, built under `cache_dir` on first
    use (400 warm-up steps: about 4 minutes on 2 busy cores)."""
    entry = _cached(cache_dir, "code", params, lambda d: _build(d, params))
    return DemoAssets(
        entry / MODEL_DIR, entry / code_task.TRAIN_FILE, entry / code_task.VALIDATION_FILE
    )
