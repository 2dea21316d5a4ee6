"""`builtin:math-code`: one tiny model for a run of two domains, math and code (the paper's
math+code run, at toy scale).

Its rows are the code task's (scalerl.demo.code_task: a program, `reward: code`) and the larger
of two numbers below 100 (scalerl.demo.arith's question as a raw prompt, `reward: math`), each
naming its own `reward` and `domain`, so one file holds both and the run scores and reports each
row by its domain. The model is warmed up on both with the digits blurred (the numbers in math
answers, the constants in programs), so each domain starts low and RL can raise both. The
validation file alternates the domains: any prefix of it (`data.validation.prompts`) holds as
many of each.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from scalerl.demo import arith, code_task
from scalerl.demo.assets import DemoAssets, _cached, _key, _warm_and_save
from scalerl.demo.code_assets import CODE_SHAPE, CODE_WARMUP, MERGES, build_tokenizer, code_framing
from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.demo.warmup import WarmupConfig

MODEL_DIR = "model"
TRAIN_FILE = "train.jsonl"
VALIDATION_FILE = "validation.jsonl"
CODE, MATH = "code", "math"  # each is the domain and the reward of its rows


@dataclass(frozen=True)
class MathCodeParams:
    """Everything the math-code assets depend on; its hash names the cache entry."""

    code: code_task.CodeTask = field(default_factory=code_task.CodeTask)
    larger: arith.LargerTask = field(default_factory=arith.LargerTask)
    math_train: int = 1500
    math_validation: int = 200
    merges: int = MERGES
    shape: TinyModelShape = CODE_SHAPE
    # Twice the rows to learn: longer than the code task's alone.
    warmup: WarmupConfig = replace(CODE_WARMUP, steps=600)

    VERSION = 1  # bump when the build's code changes what it produces

    def key(self) -> str:
        return _key(self)


def math_rows(rows: list[arith.Row]) -> list[code_task.Row]:
    """arith's rows as raw prompts (the question on a line), scored by `math`."""
    return [
        {
            "id": f"math-{row['id']}",
            "prompt": f"# {row[arith.PROMPT_FIELD]}\n",
            "answer": row[arith.ANSWER_FIELD],
            "solution": row[arith.ANSWER_FIELD],
            "reward": MATH,
            "domain": MATH,
        }
        for row in rows
    ]


def code_rows(rows: list[code_task.Row]) -> list[code_task.Row]:
    return [{**row, "id": f"code-{row['id']}", "reward": CODE, "domain": CODE} for row in rows]


def make_splits(params: MathCodeParams) -> tuple[list[code_task.Row], list[code_task.Row]]:
    """Training rows of both domains shuffled together; validation rows alternating."""
    code_train, code_validation = code_task.make_splits(params.code)
    larger_train, larger_validation = arith.make_splits(
        params.larger,
        train=params.math_train,
        validation=params.math_validation,
        seed=params.code.seed,
    )
    training = code_rows(code_train) + math_rows(larger_train)
    random.Random(params.code.seed).shuffle(training)
    one, other = code_rows(code_validation), math_rows(larger_validation)
    alternating = [row for pair in zip(one, other, strict=False) for row in pair]
    shorter = min(len(one), len(other))
    return training, alternating + one[shorter:] + other[shorter:]


def _build(directory: Path, params: MathCodeParams) -> dict[str, object]:
    """Write both domains' rows and the model warmed up on them into `directory`."""
    training, validation = make_splits(params)
    code_task.write_jsonl(directory / TRAIN_FILE, training)
    code_task.write_jsonl(directory / VALIDATION_FILE, validation)
    model_path = build_random_model(
        directory / MODEL_DIR,
        shape=params.shape,
        seed=params.code.seed,
        tokenizer=build_tokenizer(training, params.merges),
    )
    examples = [(row["prompt"], row["solution"]) for row in training]
    return _warm_and_save(model_path, code_framing, examples, code_task.DIGITS, params.warmup)


def prepare_math_code(cache_dir: Path, params: MathCodeParams = MathCodeParams()) -> DemoAssets:
    """The math-code rows and base model for `params`, built under `cache_dir` on first use."""
    entry = _cached(cache_dir, "math-code", params, lambda d: _build(d, params))
    return DemoAssets(entry / MODEL_DIR, entry / TRAIN_FILE, entry / VALIDATION_FILE)
