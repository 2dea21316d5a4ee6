"""The code built-in's problems: every row holds call-based tests that `reward: code` reads, that a
program written here (not the task's own solution) passes in the real sandbox, and that a program
with a constant one off fails; the splits are disjoint; the cached build is complete."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from scalerl.demo import code_assets, code_task
from scalerl.demo.builtins import known_names
from scalerl.demo.code_assets import CodeParams, prepare_code
from scalerl.demo.model import TinyModelShape
from scalerl.demo.warmup import WarmupConfig
from scalerl.generator.code_reward import parse_tests, score_code
from scalerl.generator.prompts import load_examples

# A few warm-up steps on a smaller model: enough to exercise the whole build in seconds.
QUICK = CodeParams(
    task=code_task.CodeTask(train_per_family=4, validation_per_family=2),
    shape=TinyModelShape(hidden=32, layers=1, heads=1, intermediate=64, max_positions=96),
    warmup=WarmupConfig(steps=2, batch=8, warmup_steps=1),
)

# What each family's `f` returns, written here again as plain loops: the row's expected outputs
# are checked against these, never against the task's own expressions.
Reference = Callable[[Any, list[int]], Any]


def _sum_where(keep: Callable[[int, list[int]], bool]) -> Reference:
    def total(xs: list[int], k: list[int]) -> int:
        result = 0
        for value in xs:
            if keep(value, k):
                result += value
        return result

    return total


def _count_where(keep: Callable[[int, list[int]], bool]) -> Reference:
    return lambda xs, k: sum(1 for value in xs if keep(value, k))


def _keep_where(keep: Callable[[int, list[int]], bool]) -> Reference:
    return lambda xs, k: [value for value in xs if keep(value, k)]


def _rotate(s: str, k: list[int]) -> str:
    turn = min(k[0], len(s))
    return s[turn:] + s[:turn]


ABOVE = lambda v, k: v > k[0]  # noqa: E731
BELOW = lambda v, k: v < k[0]  # noqa: E731
BETWEEN = lambda v, k: k[0] < v < k[1]  # noqa: E731
REFERENCES: dict[str, Reference] = {
    "sum_above": _sum_where(ABOVE),
    "sum_below": _sum_where(BELOW),
    "count_above": _count_where(ABOVE),
    "count_below": _count_where(BELOW),
    "keep_above": _keep_where(ABOVE),
    "keep_below": _keep_where(BELOW),
    "count_of": _count_where(lambda v, k: v == k[0]),
    "plus": lambda xs, k: [v + k[0] for v in xs],
    "minus": lambda xs, k: [v - k[0] for v in xs],
    "times": lambda xs, k: [v * k[0] for v in xs],
    "modulo": lambda xs, k: [v - (v // k[0]) * k[0] for v in xs],
    "sum_multiples": _sum_where(lambda v, k: v // k[0] * k[0] == v),
    "keep_between": _keep_where(BETWEEN),
    "count_between": _count_where(BETWEEN),
    "first": lambda xs, k: [xs[i] for i in range(min(k[0], len(xs)))],
    "s_first": lambda s, k: "".join(s[i] for i in range(min(k[0], len(s)))),
    "s_last": lambda s, k: s[max(0, len(s) - k[0]) :],
    "s_drop": lambda s, k: "".join(s[i] for i in range(k[0], len(s))),
    "s_rotate": _rotate,
    "s_slice": lambda s, k: "".join(s[i] for i in range(k[0], min(k[1], len(s)))),
}

# The same, as programs a user would write, for the sandbox: `{0}` and `{1}` are the constants.
PROGRAMS: dict[str, str] = {
    "sum_above": "def f(xs):\n    t = 0\n    for v in xs:\n        if v > {0}:\n"
                 "            t += v\n    return t",
    "sum_below": "def f(xs):\n    return sum(filter(lambda v: v < {0}, xs))",
    "count_above": "def f(xs):\n    return sum(v > {0} for v in xs)",
    "count_below": "def f(xs):\n    return sum(v < {0} for v in xs)",
    "keep_above": "def f(xs):\n    return list(filter(lambda v: v > {0}, xs))",
    "keep_below": "def f(xs):\n    return [v for v in xs if not v >= {0}]",
    "count_of": "def f(xs):\n    return len([v for v in xs if v == {0}])",
    "plus": "def f(xs):\n    return list(map(lambda v: v + {0}, xs))",
    "minus": "def f(xs):\n    return [v + -{0} for v in xs]",
    "times": "def f(xs):\n    return [{0} * v for v in xs]",
    "modulo": "def f(xs):\n    return [divmod(v, {0})[1] for v in xs]",
    "sum_multiples": "def f(xs):\n    return sum(v for v in xs if not v % {0})",
    "keep_between": "def f(xs):\n    return [v for v in xs if v > {0} and v < {1}]",
    "count_between": "def f(xs):\n    return sum(1 for v in xs if {0} < v and v < {1})",
    "first": "def f(xs):\n    out = []\n    for v in xs[:{0}]:\n        out.append(v)\n"
             "    return out",
    "s_first": "def f(s):\n    return ''.join(list(s)[:{0}])",
    "s_last": "def f(s):\n    return s[max(0, len(s) - {0}):]",
    "s_drop": "def f(s):\n    return ''.join(list(s)[{0}:])",
    "s_rotate": "import collections\ndef f(s):\n    d = collections.deque(s)\n"
                "    d.rotate(-min({0}, len(s)))\n    return ''.join(d)",
    "s_slice": "def f(s):\n    return ''.join(c for i, c in enumerate(s) if {0} <= i < {1})",
}  # fmt: skip


@pytest.fixture(scope="module")
def splits() -> tuple[list[code_task.Row], list[code_task.Row]]:
    return code_task.make_splits()


def expected(row: code_task.Row) -> list[Any]:
    tests = json.loads(row["answer"])
    return [REFERENCES[row["family"]](args[0], row["constants"]) for args in tests["inputs"]]


# --- rows -----------------------------------------------------------------------------------


def test_every_family_has_a_reference_here() -> None:
    assert {f.name for f in code_task.FAMILIES} == set(REFERENCES) == set(PROGRAMS)


def test_rows_hold_call_based_tests_with_the_outputs_computed_here(splits: Any) -> None:
    training, validation = splits
    for row in training + validation:
        tests = parse_tests(row["answer"])
        assert tests.kind == "call" and tests.fn_name == "f"
        assert len(tests.inputs) >= code_task.CASES
        assert tests.outputs == expected(row), row["id"]


def test_prompts_name_the_argument_and_every_constant(splits: Any) -> None:
    for row in splits[0] + splits[1]:
        arg = "s" if row["family"].startswith("s_") else "xs"
        assert row["prompt"].startswith(f"# f({arg}) returns ") and row["prompt"].endswith("\n")
        numbers = [int(n) for n in re.findall(r"\d+", row["prompt"])]
        assert numbers == row["constants"], row


def test_splits_are_disjoint_and_validation_interleaves_the_families(splits: Any) -> None:
    training, validation = splits
    key = lambda row: (row["family"], tuple(row["constants"]))  # noqa: E731
    assert not {key(r) for r in training} & {key(r) for r in validation}
    assert len({key(r) for r in training}) == len(training)
    families = [f.name for f in code_task.FAMILIES]
    assert [r["family"] for r in validation[: len(families)]] == families
    assert len({r["id"] for r in training + validation}) == len(training) + len(validation)


def test_splits_are_deterministic(splits: Any) -> None:
    assert code_task.make_splits() == splits
    small = code_task.CodeTask(train_per_family=2, validation_per_family=1)
    assert code_task.make_splits(small) != code_task.make_splits(replace(small, seed=1))


def digit_slips(constants: list[int]) -> list[list[int]]:
    """Every constant list one digit (of one constant) away, written here afresh."""
    out = []
    for i, value in enumerate(constants):
        text = str(value)
        for pos in range(len(text)):
            for digit in "0123456789":
                changed = text[:pos] + digit + text[pos + 1 :]
                if changed != text and (len(changed) == 1 or changed[0] != "0"):
                    out.append([*constants[:i], int(changed), *constants[i + 1 :]])
    return out


def safe(reference: Reference, arg: Any, constants: list[int]) -> Any:
    try:
        return reference(arg, constants)
    except ZeroDivisionError:
        return ZeroDivisionError


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_slipped_digit_fails_some_test(data: st.DataObject) -> None:
    family = data.draw(st.sampled_from(code_task.FAMILIES))
    constants = list(data.draw(st.sampled_from(family.instances())))
    row = code_task.make_row(family, tuple(constants), "x", random.Random(data.draw(st.integers())))
    inputs = [args[0] for args in json.loads(row["answer"])["inputs"]]
    reference = REFERENCES[family.name]
    for other in digit_slips(constants):
        assert [safe(reference, arg, other) for arg in inputs] != expected(row), other


def test_bad_split_sizes_are_refused() -> None:
    from scalerl.errors import InputError

    with pytest.raises(InputError, match="train_per_family"):
        code_task.make_splits(code_task.CodeTask(train_per_family=0))


# --- through the sandbox ---------------------------------------------------------------------


def one_per_family(rows: list[code_task.Row]) -> list[code_task.Row]:
    seen: dict[str, code_task.Row] = {}
    for row in rows:
        seen.setdefault(row["family"], row)
    return list(seen.values())


def test_programs_written_here_pass_and_one_off_constants_fail_in_the_sandbox(
    splits: Any,
) -> None:
    for row in one_per_family(splits[1]):
        program = PROGRAMS[row["family"]].format(*row["constants"])
        verdict = score_code(program, row["answer"])
        assert verdict.reward == 1.0, (row["id"], program, verdict.to_dict())
        off = [row["constants"][0] + 1, *row["constants"][1:]]
        wrong = score_code(PROGRAMS[row["family"]].format(*off), row["answer"])
        assert wrong.reward == -1.0 and wrong.passed < len(wrong.tests), (row["id"], off)


def test_the_rows_own_solutions_pass_in_the_sandbox(splits: Any) -> None:
    for row in one_per_family(splits[0]):
        assert score_code(row["solution"], row["answer"]).reward == 1.0, row["id"]


# --- the built model and files ----------------------------------------------------------------


def test_builtin_code_is_registered() -> None:
    assert {"builtin:code", "builtin:code/train", "builtin:code/validation"} <= set(known_names())


def test_the_tokenizer_covers_every_program_and_keeps_digits_whole(splits: Any) -> None:
    tokenizer = code_assets.build_tokenizer(splits[0])
    for row in splits[0] + splits[1]:
        for text in (row["prompt"], row["solution"]):
            assert tokenizer.decode(tokenizer(text, add_special_tokens=False).input_ids) == text
    for digit in code_task.DIGITS:
        assert len(tokenizer(f"x > {digit}", add_special_tokens=False).input_ids) == len(
            tokenizer("x > 0", add_special_tokens=False).input_ids
        )
    program = "def g(a, b):\n\tif a:\n\t\treturn {'k': [b]}  # ünïcode\n"
    assert tokenizer.decode(tokenizer(program, add_special_tokens=False).input_ids) == program


def test_a_quick_build_is_complete_and_cached(tmp_path: Path) -> None:
    built = prepare_code(tmp_path, QUICK)
    assert prepare_code(tmp_path, QUICK) == built
    assert (built.model_path / "model.safetensors").is_file()
    tokenizer = AutoTokenizer.from_pretrained(str(built.model_path))
    rows = code_task.read_rows(built.train_path)
    assert tokenizer.decode(tokenizer(rows[0]["solution"]).input_ids) == rows[0]["solution"]
    # Read as a run reads them: prompt and answer fields, every answer holding tests.
    for path in (built.train_path, built.validation_path):
        examples = load_examples(str(path), "prompt", "answer")
        assert examples and all(parse_tests(e.answer).kind == "call" for e in examples)
    manifest = json.loads((built.model_path.parent / "manifest.json").read_text())
    assert manifest["version"] == CodeParams.VERSION
