"""The math-code built-in: one file of two domains, each row naming its reward and domain, read
as a run reads them; math answers checked against the larger number read from the question."""

from __future__ import annotations

import re

import pytest

from scalerl.demo import code_task, math_code
from scalerl.demo.builtins import known_names
from scalerl.demo.math_code import MathCodeParams, prepare_math_code
from scalerl.demo.model import TinyModelShape
from scalerl.demo.warmup import WarmupConfig
from scalerl.generator.code_reward import parse_tests
from scalerl.generator.prompts import load_examples
from scalerl.generator.rewards import load_reward

SMALL = MathCodeParams(
    code=code_task.CodeTask(train_per_family=3, validation_per_family=2),
    math_train=40,
    math_validation=10,
    shape=TinyModelShape(hidden=32, layers=1, heads=1, intermediate=64, max_positions=96),
    warmup=WarmupConfig(steps=2, batch=8, warmup_steps=1),
)
QUESTION = re.compile(r"^# Which is larger, (\d+) or (\d+)\?\n$")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> math_code.DemoAssets:
    return prepare_math_code(tmp_path_factory.mktemp("cache"), SMALL)


def test_rows_name_their_reward_and_domain_and_validation_alternates() -> None:
    training, validation = math_code.make_splits(SMALL)
    for row in training + validation:
        assert row["reward"] == row["domain"] in ("code", "math")
        if row["domain"] == "code":
            assert parse_tests(row["answer"]).kind == "call"
        else:
            a, b = map(int, QUESTION.match(row["prompt"]).groups())  # type: ignore[union-attr]
            assert a != b and row["answer"] == str(max(a, b))
    assert sum(r["domain"] == "math" for r in training) == SMALL.math_train
    assert [r["domain"] for r in validation[:6]] == ["code", "math"] * 3
    ids = [r["id"] for r in training + validation]
    assert len(set(ids)) == len(ids)


def test_a_run_reads_each_row_with_its_reward_and_domain(built: math_code.DemoAssets) -> None:
    examples = load_examples(str(built.validation_path), "prompt", "answer", reward="exact")
    assert {(e.reward, e.domain) for e in examples} == {("code", "code"), ("math", "math")}
    for example in examples:
        if example.domain == "math":
            reward = load_reward(example.reward)
            assert reward(example.answer, example.answer) > 0
            assert reward(str(int(example.answer) + 1), example.answer) < 0


def test_the_build_is_complete_and_cached(built: math_code.DemoAssets) -> None:
    assert (built.model_path / "model.safetensors").is_file()
    assert prepare_math_code(built.model_path.parent.parent, SMALL) == built
    assert {"builtin:math-code", "builtin:math-code/validation"} <= set(known_names())
