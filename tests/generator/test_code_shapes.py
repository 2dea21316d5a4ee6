"""Every shape a row's tests may come in reads as the same tests, and anything else is refused
with InputError (never another exception): hypothesis over the shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalerl.errors import InputError
from scalerl.generator.code_reward import CodeTests, parse_tests

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
CASES = st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=5)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


@given(CASES, st.sampled_from(["json", "python", "deepcoder", "lines"]))
def test_stdin_stdout_tests_read_alike_in_every_encoding(
    cases: list[tuple[str, str]], encoding: str
) -> None:
    inputs, outputs = [c[0] for c in cases], [c[1] for c in cases]
    expected = CodeTests("stdio", inputs, outputs)
    if encoding == "json":
        reference = json.dumps({"inputs": inputs, "outputs": outputs})
    elif encoding == "python":  # a JSONL object's repr, as the data loader hands it over
        reference = repr({"inputs": inputs, "outputs": outputs})
    elif encoding == "deepcoder":
        reference = json.dumps(
            [{"input": i, "output": o, "type": "stdin_stdout"} for i, o in cases]
        )
    else:  # a list of lines stands for those lines, each ending in a newline
        split = [(i.split("\n"), o.split("\n")) for i, o in cases]
        reference = json.dumps({"inputs": [s[0] for s in split], "outputs": [s[1] for s in split]})
        expected = CodeTests("stdio", [i + "\n" for i in inputs], [o + "\n" for o in outputs])
    assert parse_tests(reference) == expected


@given(st.lists(st.lists(JSONISH, max_size=3), min_size=1, max_size=4), st.data())
def test_call_based_tests_keep_their_arguments_and_results(
    args: list[list[Any]], data: st.DataObject
) -> None:
    results = data.draw(st.lists(JSONISH, min_size=len(args), max_size=len(args)))
    reference = json.dumps({"fn_name": "f", "inputs": args, "outputs": results, "tolerance": 0.5})
    assert parse_tests(reference) == CodeTests("call", args, results, "f", 0.5)


@given(JSONISH)
def test_anything_else_is_refused_with_input_error(value: Any) -> None:
    for reference in (json.dumps(value), repr(value)):
        try:
            tests = parse_tests(reference)
        except InputError:
            continue
        # What is accepted is a well-formed set of tests.
        assert tests.inputs and (tests.kind == "assert" or len(tests.inputs) == len(tests.outputs))


@pytest.mark.parametrize("bracket", ["[]", "()"])
def test_absurd_nesting_is_refused_not_a_crash(bracket: str) -> None:
    with pytest.raises(InputError):
        parse_tests(bracket[0] * 100_000 + bracket[1] * 100_000)
