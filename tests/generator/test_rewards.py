"""Rewards: +1/−1 for exact and math answers, the answer part of a completion, loading by name."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from scalerl.errors import InputError
from scalerl.generator import rewards
from scalerl.generator.rewards import answer_text, exact, load_reward


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("</think>dcba", "dcba"),
        ("let me see</think> 42 ", "42"),
        ("a</think>b</think>c", "c"),
        ("no marker at all", ""),
        ("</think>", ""),
    ],
)
def test_answer_text_is_what_follows_the_last_think_end(completion: str, expected: str) -> None:
    assert answer_text(completion) == expected


def test_answer_text_accepts_other_markers_and_models_that_do_not_think() -> None:
    assert answer_text("think<end>ans", think_end="<end>") == "ans"
    assert answer_text(" 15 ", think_end=None) == "15"


def test_exact_ignores_surrounding_whitespace_only() -> None:
    assert exact(" dcba\n", "dcba") == 1.0
    assert exact("dcb a", "dcba") == -1.0
    assert exact("", "dcba") == -1.0


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "0.5"),
        ("1/2", "0.5"),
        ("The answer is \\boxed{12}", "12"),
        ("12.0", "12"),
        ("1+x^2", "x^2+1"),
        ("$\\sqrt{2}$", "\\sqrt{2}"),
        ("dcba", "dcba"),
    ],
)
def test_math_accepts_equal_values(answer: str, reference: str) -> None:
    assert rewards.math(answer, reference) == 1.0


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("3", "4"),
        ("", "4"),
        ("x^2+2", "x^2+1"),
        ("\\frac{1}{", "0.5"),
        ("ab", "a+b"),
        ("1", "x^2+1"),
    ],
)
def test_math_rejects_different_or_unparseable_values(answer: str, reference: str) -> None:
    assert rewards.math(answer, reference) == -1.0


def test_math_works_off_the_main_thread() -> None:
    results: list[float] = []
    thread = threading.Thread(target=lambda: results.append(rewards.math("0.5", "\\frac{1}{2}")))
    thread.start()
    thread.join()
    assert results == [1.0]


def test_math_turns_errors_into_incorrect(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object, **kwargs: object) -> bool:
        raise RuntimeError("sympy blew up")

    monkeypatch.setattr("math_verify.verify", explode)
    assert rewards.math("0.5", "\\frac{1}{2}") == -1.0


def test_load_reward_knows_the_builtins() -> None:
    assert load_reward("exact") is exact
    assert load_reward("math") is rewards.math


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "scalerl_test_reward_module"
    (tmp_path / f"{name}.py").write_text(
        "def length_match(answer, reference):\n"
        "    return 1.0 if len(answer) == len(reference) else -1.0\n"
        "class Scorer:\n"
        "    @staticmethod\n"
        "    def score(answer, reference):\n"
        "        return 1.0\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_load_reward_imports_module_function(reward_module: str) -> None:
    fn = load_reward(f"{reward_module}:length_match")
    assert fn("abc", "xyz") == 1.0 and fn("ab", "xyz") == -1.0
    assert load_reward(f"{reward_module}:Scorer.score")("a", "b") == 1.0


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        (":missing", "has no 'missing'"),
        (":NOT_CALLABLE", "'NOT_CALLABLE' is not callable"),
    ],
)
def test_load_reward_reports_bad_functions(reward_module: str, suffix: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as err:
        load_reward(reward_module + suffix)
    assert reward_module + suffix in str(err.value)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("fuzzy", "is not 'exact', 'math', 'code' or 'module:function'"),
        (":fn", "is not 'exact', 'math', 'code' or 'module:function'"),
        ("module:", "is not 'exact', 'math', 'code' or 'module:function'"),
    ],
)
def test_load_reward_rejects_bad_names(name: str, message: str) -> None:
    with pytest.raises(InputError, match=message) as err:
        load_reward(name)
    assert repr(name) in str(err.value)
