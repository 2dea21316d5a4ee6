"""Asserts judged outside the program: which parts go to the sandbox, how their values come back
(the harness's tags, rebuilt as exact builtin values) and how the rest is judged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalerl.errors import InputError
from scalerl.generator.code_asserts import parse_assert
from scalerl.generator.code_judge import Opaque, decode_value

# The harness's own `tag`, taken from its text without running its main().
_HARNESS = (Path(__file__).parents[2] / "scalerl/generator/code_harness.py").read_text()
_NS: dict[str, Any] = {"__name__": "harness"}
exec(_HARNESS.rsplit("\nmain()", 1)[0], _NS)  # noqa: S102 — our own file
tag = _NS["tag"]

PLAIN = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.frozensets(st.integers() | st.text(max_size=4), max_size=4)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(PLAIN)
def test_a_plain_value_comes_back_as_itself_with_its_exact_type(value: Any) -> None:
    assert _same(decode_value(json.loads(json.dumps(tag(value)))), value)


class Liar(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class Anything:
    def __eq__(self, other: object) -> bool:
        return True


@pytest.mark.parametrize("value", [Liar(3), Anything(), [1, Liar(2)], {"a": Anything()}])
def test_a_subclass_or_an_object_comes_back_opaque_and_fails_its_assert(value: Any) -> None:
    check = parse_assert("assert add(1, 2) == 3")
    decoded = decode_value(json.loads(json.dumps(tag(value))))
    assert check.judge([decoded]) != ""


@pytest.mark.parametrize(
    ("source", "parts", "values", "holds"),
    [
        ("assert add(1, 2) == 3", ("add(1, 2)",), [3], True),
        ("assert add(1, 2) == 3", ("add(1, 2)",), [4], False),
        ("assert set(f((3, 4), (4, 5))) == set((4,))", ("f((3, 4), (4, 5))",), [(4,)], True),
        ("assert math.isclose(h(1, 1), 2 ** 0.5)", ("h(1, 1)",), [2**0.5], True),
        ("assert not is_prime(8)", ("is_prime(8)",), [False], True),
        ("assert all(v > 0 for v in f(3))", ("f(3)",), [[1, 2]], True),
        ("assert all(v > 0 for v in f(3))", ("f(3)",), [[1, -2]], False),
        ("assert sorted(f(x), key=lambda t: t[1]) == [(2, 1)]", ("f(x)",), [[(2, 1)]], True),
        ("assert f(2) * 3 == 6", ("f(2) * 3",), [6], True),
        ("assert f(x) == g(x)", ("f(x)", "g(x)"), [1, 1], True),
    ],
)
def test_parts_that_need_the_program_go_to_the_sandbox_the_rest_is_judged_here(
    source: str, parts: tuple[str, ...], values: list[Any], holds: bool
) -> None:
    check = parse_assert(source)
    assert check.parts == parts
    assert (check.judge(values) == "") is holds


@pytest.mark.parametrize("source", ["x = add(1, 2)", "assert a\nassert b", "for x in y: pass"])
def test_anything_but_one_assert_is_refused(source: str) -> None:
    with pytest.raises(InputError, match="single assert"):
        parse_assert(source)


def test_an_opaque_value_equals_nothing() -> None:
    opaque = Opaque("X")
    assert opaque != opaque and opaque != 3
