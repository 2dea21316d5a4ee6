"""Rewards: score a completion's answer against the reference answer, +1 correct / −1 incorrect.

The paper's recipe uses ±1 rewards (not 1/0), so a group's advantages are centred on a symmetric
scale. A reward function sees only the answer text — what follows the last end-of-thinking
marker (`scalerl.generator.tokens`), decoded without special tokens — never the thinking, so a
model cannot earn reward by musing about the right answer.

`math` uses math-verify, which guards parsing and comparison with `signal.alarm` timeouts. Signals
only work on the main thread (elsewhere math-verify raises ValueError), so `math` uses a timeout of
`MATH_TIMEOUT_SECONDS` on the main thread and none off it. Off the main thread a pathological
expression could therefore run long: callers that score in threads should accept that or score in
a separate process.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable

from scalerl.errors import InputError
from scalerl.spec import THINK_END, CodeSpec

RewardFn = Callable[[str, str], float]
"""(answer text, reference answer) -> reward, +1.0 correct, −1.0 incorrect."""

CORRECT = 1.0
INCORRECT = -1.0
MATH_TIMEOUT_SECONDS = 3
_MATH_ANCHORS = ("$", "\\boxed", "\\(", "\\[")


def answer_text(completion_text: str, think_end: str | None = THINK_END) -> str:
    """The answer part of a completion already decoded without special tokens: the text after
    the last `think_end` (all of it when `think_end` is None).

    Empty when the completion never closed its thinking — such a completion has no answer.
    Generators split on token ids instead (`ModelTokens.answer_text`); this is for text.
    """
    if think_end is None:
        return completion_text.strip()
    _, found, answer = completion_text.rpartition(think_end)
    return answer.strip() if found else ""


def exact(answer: str, reference: str) -> float:
    """+1 when the answer equals the reference, ignoring surrounding whitespace."""
    return CORRECT if answer.strip() == reference.strip() else INCORRECT


def _math_timeout() -> int | None:
    # math-verify's timeouts are signal.alarm, which raises ValueError off the main thread.
    if threading.current_thread() is threading.main_thread():
        return MATH_TIMEOUT_SECONDS
    return None


def _parse(text: str, timeout: int | None) -> list[object]:
    """Parse `text` with math-verify; bare expressions are read whole, as LaTeX math.

    Without `$...$` (or `\\boxed`) math-verify extracts the first number it finds ("1+x^2" -> 1),
    so unanchored text is tried wrapped in `$...$` first, and as prose only if that finds nothing.
    """
    from math_verify import parse

    if not any(anchor in text for anchor in _MATH_ANCHORS):
        parsed = parse(f"${text}$", parsing_timeout=timeout)
        if parsed:
            return list(parsed)
    return list(parse(text, parsing_timeout=timeout))


def math(answer: str, reference: str) -> float:
    """+1 when math-verify finds the answer mathematically equal to the reference ("0.5" = "1/2").

    Identical strings are correct without parsing (so non-mathematical references still work);
    anything math-verify cannot parse, or any error or timeout, is incorrect. Letters are read as
    variables ("dcab" equals "dcba" as a product), so word answers want `exact`.
    """
    answer, reference = answer.strip(), reference.strip()
    if answer and answer == reference:
        return CORRECT
    try:
        from math_verify import verify

        timeout = _math_timeout()
        gold, predicted = _parse(reference, timeout), _parse(answer, timeout)
        if gold and predicted and verify(gold, predicted, timeout_seconds=timeout):
            return CORRECT
    except Exception:  # noqa: BLE001 — a reward must never crash the generator; unparseable = wrong
        return INCORRECT
    return INCORRECT


def code(answer: str, reference: str) -> float:
    """+1 when the answer's program passes every test the reference holds, run in a sandbox
    (scalerl.generator.code_reward, which also gives the per-test record)."""
    from scalerl.generator.code_reward import code as run_code

    return run_code(answer, reference)


BUILTIN: dict[str, RewardFn] = {"exact": exact, "math": math, "code": code}


def load_reward(name: str, code_spec: CodeSpec | None = None) -> RewardFn:
    """The reward named by a spec: "exact", "math", "code" (with `code_spec`'s limits, the
    spec's defaults when None) or "module:function" (an importable callable).

    A dotted function part ("pkg.mod:Class.method") is followed attribute by attribute.
    """
    if name == "code" and code_spec is not None:
        from scalerl.generator.code_reward import code_reward

        return code_reward(code_spec)
    if name in BUILTIN:
        return BUILTIN[name]
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise InputError(f"reward {name!r} is not 'exact', 'math', 'code' or 'module:function'")
    try:
        target: object = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 — any import failure is the user's module, say so
        raise InputError(f"reward {name!r}: cannot import module {module_name!r}: {err}") from err
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise InputError(f"reward {name!r}: module {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise InputError(f"reward {name!r}: {attribute!r} is not callable")
    return target
