"""The calculator server's arithmetic (environments/openenv_calculator), against Python's own:
what its `calculate` tool answers and how `submit` compares numbers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

SOURCE = (
    Path(__file__).resolve().parents[2]
    / "environments/openenv_calculator/openenv_calculator/arithmetic.py"
)


def _arithmetic() -> ModuleType:
    """The module from its file: no install needed (test_openenv installs the package)."""
    spec = importlib.util.spec_from_file_location("calculator_arithmetic", SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


arithmetic = _arithmetic()
numbers = st.integers(-(10**6), 10**6).map(str) | st.floats(0.01, 1e6).map(repr)
operators = st.sampled_from(["+", "-", "*", "/", "//", "%"])
expressions = st.recursive(
    numbers,
    lambda inner: st.tuples(inner, operators, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(expression=expressions)
def test_calculate_agrees_with_python(expression: str) -> None:
    try:
        expected = eval(expression)  # trusted: built from numbers and operators above
    except ZeroDivisionError:
        with pytest.raises(ValueError, match="division by zero"):
            arithmetic.evaluate(expression)
        return
    assert arithmetic.evaluate(expression) == expected


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("__import__('os').system('true')", "not allowed"),
        ("(1).__class__", "not allowed"),
        ("x + 1", "not allowed"),
        ("'7' * 3", "not allowed"),
        ("True + 1", "not allowed"),
        ("2 ** 10 ** 10", "exponent 10000000000 is larger than 64"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 201, "longer than 200"),
    ],
)
def test_calculate_refuses_anything_but_bounded_arithmetic(expression: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        arithmetic.evaluate(expression)


@given(value=st.integers(-(10**9), 10**9))
def test_a_submission_matches_the_number_however_it_is_written(value: int) -> None:
    for written in (str(value), f"{value:,}", f" {value}.0 ", f"{value}\n"):
        assert arithmetic.same_number(written, str(value))
    assert not arithmetic.same_number(str(value + 1), str(value))
    assert not arithmetic.same_number(f"about {value}", str(value))


@pytest.mark.asyncio
async def test_with_calculate_scored_only_the_first_right_calculation_earns_the_reward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OPENENV_CALCULATOR_SCORE_CALCULATE: the adapter sums an episode's step rewards, so a right
    `calculate` repeated must not earn more than once (a policy would learn to repeat it)."""
    pytest.importorskip("openenv")
    from openenv.core.env_server.mcp_types import CallToolAction

    monkeypatch.setenv("OPENENV_CALCULATOR_SCORE_CALCULATE", "1")
    server = _server_module()
    env = server.CalculatorEnvironment()
    rewards = []
    for episode in range(2):  # a new episode pays again
        env.reset(answer="408")
        for expression in ["12*30", "12*34", "12*34", "400+8", "1"]:
            action = CallToolAction(tool_name="calculate", arguments={"expression": expression})
            rewards.append((episode, (await env.step_async(action)).reward))
    assert rewards == [(e, r) for e in range(2) for r in [0.0, 1.0, 0.0, 0.0, 0.0]]


def _server_module() -> ModuleType:
    """The server's module, read again under the environment this test set (it reads its
    settings at import)."""
    spec = importlib.util.spec_from_file_location(
        "calculator_server_scored", SOURCE.with_name("server.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
