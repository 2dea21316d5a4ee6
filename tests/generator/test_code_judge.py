"""Judging printed output and returned values like competitive-programming judges do, checked
against comparisons built from the test's own structures (not by re-parsing)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from scalerl.generator.code_judge import same_output, same_value

WORD = st.text(alphabet="abcxyz019-+.", min_size=1, max_size=5)
LINES = st.lists(st.lists(WORD, max_size=4), max_size=5)
GAP = st.sampled_from([" ", "  ", "\t", " \t "])


@st.composite
def rendered(draw: st.DrawFn, lines: list[list[str]]) -> str:
    """`lines` printed with arbitrary spacing, line ends and trailing blank lines."""
    out = []
    for tokens in lines:
        lead = draw(st.sampled_from(["", " "]))
        text = lead + "".join(t + draw(GAP) for t in tokens[:-1]) + "".join(tokens[-1:])
        out.append(text + draw(st.sampled_from(["", " ", "\t"])))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    return end.join(out) + end * draw(st.integers(0, 3))


def _content(lines: list[list[str]]) -> list[list[str]]:
    """What a judge compares: the lines, less the empty ones at the end."""
    lines = [list(line) for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


@given(st.data(), LINES, LINES, st.booleans())
def test_output_is_judged_by_its_lines_and_tokens_not_its_spacing(
    data: st.DataObject, a: list[list[str]], b: list[list[str]], same: bool
) -> None:
    b = a if same else b
    got, expected = data.draw(rendered(a)), data.draw(rendered(b))
    assert same_output(got, expected) == (_content(a) == _content(b))


@given(
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([1e-6, 1e-4, 1e-2]),
    st.booleans(),
    st.booleans(),
)
def test_numbers_are_equal_within_the_tolerance_and_only_with_one(
    x: float, tolerance: float, near: bool, negative: bool
) -> None:
    scale = max(1.0, abs(x))
    # Clearly inside (a third of the tolerance) or clearly outside (three times it).
    delta = (tolerance / 3 if near else 3 * tolerance * scale) * (-1 if negative else 1)
    y = x + delta
    assert same_output(f"{x!r}\n", f"{y!r}\n", tolerance) == near
    assert same_output(f"{x!r}", f"{x!r}") and (
        same_output(f"{x!r}", f"{y!r}") == (repr(x) == repr(y))
    )


def test_words_never_match_numbers_and_lines_must_line_up() -> None:
    assert not same_output("yes", "YES", 0.1)
    assert not same_output("1 2", "1\n2")
    assert same_output("1.0000001", "1", 1e-6) and not same_output("1.0000001", "1")
    assert same_output("nan", "nan") and not same_output("nan", "0", math.inf)


def test_returned_values_compare_as_json_with_floats_close_and_apps_wrapping() -> None:
    assert same_value([1, [2, 3]], [1, [2, 3]])
    assert same_value(0.1 + 0.2, 0.3)
    assert not same_value(1.5, 1.6) and same_value(1.5, 1.6, 0.2)
    assert same_value(7, [7])  # APPS/TACO store a call's result wrapped in a list
    assert not same_value([7], [[7, 8]])
    assert not same_value(True, 1) and not same_value(1, "1")
    assert same_value({"a": [1.0]}, {"a": [1]})
