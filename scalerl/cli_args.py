"""argparse types of the `scalerl` command line: each reads a number and holds it to its range,
with one line naming what is wrong (`argument` builds them)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

N = TypeVar("N", int, float)  # what an argparse type reads


def argument(
    parse: Callable[[str], N], kind: str, ok: Callable[[N], bool], rule: str
) -> Callable[[str], N]:
    """An argparse type: `text` read by `parse` (else "is not `kind`"), then held to `ok` (else
    "must be `rule`")."""

    def convert(text: str) -> N:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be {rule}")
        return value

    return convert


compute_value = argument(
    float, "a number", lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0"
)
positive_compute = argument(
    float, "a number", lambda v: math.isfinite(v) and v > 0, "a finite number > 0"
)
pass_rate = argument(float, "a number", lambda v: 0 < v <= 1, "a pass rate in (0, 1]")
count = argument(int, "an integer", lambda v: v >= 0, ">= 0")
# Checked before anything slow, such as loading a model.
positive_count = argument(int, "an integer", lambda v: v >= 1, ">= 1")
