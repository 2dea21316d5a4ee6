"""How a program's output is compared with the expected one, the way competitive-programming
judges compare: pure functions, no execution here.

Printed output (stdin/stdout tests): compared line by line and token by token, so spacing,
trailing spaces, blank lines at the end and Windows line ends do not matter, but the line
structure and every token do. With a tolerance, two tokens that both read as numbers are equal
when they differ by at most `tolerance` absolutely or relatively (as `math.isclose`); without one,
tokens must be identical.

Returned values (call-based tests): compared after a JSON round trip (tuples are lists), with
floats within the tolerance when one is given (1e-9 relative otherwise, so 0.1 + 0.2 equals 0.3).
A one-element list expected where a bare value came back is accepted: APPS and TACO store a
function's result wrapped that way.
"""

from __future__ import annotations

import math
from typing import Any

EXACT_FLOAT_RELATIVE = 1e-9  # floats from a computation vs. floats from a JSON file


def output_lines(text: str) -> list[list[str]]:
    """The tokens of each line of printed output, without the blank lines at its end."""
    lines = [line.split() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def same_token(got: str, expected: str, tolerance: float | None) -> bool:
    if got == expected:
        return True
    if tolerance is None:
        return False
    a, b = _number(got), _number(expected)
    return (
        a is not None and b is not None and math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)
    )


def same_output(got: str, expected: str, tolerance: float | None = None) -> bool:
    """Whether printed output `got` is what a judge accepts for `expected`."""
    a, b = output_lines(got), output_lines(expected)
    return len(a) == len(b) and all(
        len(x) == len(y) and all(same_token(s, t, tolerance) for s, t in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


def same_value(got: Any, expected: Any, tolerance: float | None = None) -> bool:
    """Whether a function's returned value (as JSON decodes it) matches the expected one."""
    if _equal(got, expected, tolerance):
        return True
    return (
        isinstance(expected, list)
        and len(expected) == 1
        and not isinstance(got, list)
        and _equal(got, expected[0], tolerance)
    )


def _equal(a: Any, b: Any, tolerance: float | None) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        tol = EXACT_FLOAT_RELATIVE if tolerance is None else tolerance
        return math.isclose(a, b, rel_tol=tol, abs_tol=tolerance or 0.0)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y, tolerance) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k], tolerance) for k in a)
    return type(a) is type(b) and a == b
