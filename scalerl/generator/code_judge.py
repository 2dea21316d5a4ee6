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

Values come out of the sandbox type-tagged (scalerl/generator/code_harness.py) and are rebuilt
here by `decode_value` as genuine builtin objects: only exact builtin types (None, bool, int,
float, complex, str, bytes, list, tuple, set, frozenset, dict); anything else, a subclass of one
(an int whose `__eq__` lies) included, comes back as an `Opaque` that equals nothing.
"""

from __future__ import annotations

import math
from typing import Any

EXACT_FLOAT_RELATIVE = 1e-9  # floats from a computation vs. floats from a JSON file
MAX_DEPTH = 100  # nesting of a returned value (the harness sends deeper ones as Opaque)


class Opaque:
    """A returned value that is not a plain builtin value: equal to nothing, itself included."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<not a plain value: {self.name}>"


def decode_value(tagged: Any, depth: int = 0) -> Any:
    """A value as the harness tagged it, rebuilt from builtin types; ValueError when the tags
    are not well formed."""
    if not isinstance(tagged, list) or not tagged or not isinstance(tagged[0], str):
        raise ValueError(f"not a tagged value: {str(tagged)[:80]}")
    if depth > MAX_DEPTH:
        raise ValueError("a value nested too deeply")
    tag, rest = tagged[0], tagged[1:]
    if tag == "n" and not rest:
        return None
    if len(rest) != 1 and tag != "c":
        raise ValueError(f"malformed tagged value {tag!r}")
    if tag == "b" and isinstance(rest[0], bool):
        return rest[0]
    if tag == "i" and isinstance(rest[0], str):
        return int(rest[0], 16)
    if tag == "f" and isinstance(rest[0], str):
        return float(rest[0])
    if tag == "c" and len(rest) == 2 and all(isinstance(r, str) for r in rest):
        return complex(float(rest[0]), float(rest[1]))
    if tag == "s" and isinstance(rest[0], str):
        return rest[0]
    if tag == "y" and isinstance(rest[0], str):
        return bytes.fromhex(rest[0])
    if tag == "o" and isinstance(rest[0], str):
        return Opaque(rest[0][:100])
    if tag in ("l", "t", "S", "F") and isinstance(rest[0], list):
        items = [decode_value(item, depth + 1) for item in rest[0]]
        try:
            return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
        except TypeError as err:  # an unhashable item in a set
            raise ValueError(str(err)) from err
    if tag == "d" and isinstance(rest[0], list):
        pairs = []
        for pair in rest[0]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError("malformed dict item")
            pairs.append((decode_value(pair[0], depth + 1), decode_value(pair[1], depth + 1)))
        try:
            return dict(pairs)
        except TypeError as err:
            raise ValueError(str(err)) from err
    raise ValueError(f"malformed tagged value {tag!r}")


def as_json(value: Any) -> Any:
    """A decoded value as JSON would carry it, for comparing with a JSON file's expected
    output: tuples as lists, sets as lists sorted by repr, dict keys as strings."""
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((as_json(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, (bytes, complex)):
        return Opaque(type(value).__name__)  # JSON holds neither: no expected value is one
    return value


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
