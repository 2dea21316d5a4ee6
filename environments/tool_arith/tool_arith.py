"""tool-arith: two-digit multiplication answered with a calculator tool (a verifiers ToolEnv).

Each prompt asks for the product of two numbers from 10 to 99 ("What is 37*48?"), which a small
model cannot work out alone but can answer exactly by calling `calculate("37*48")` and copying the
result. The reward is 1.0 when the final assistant message is the product, else 0.0.

The train and eval splits are disjoint as unordered pairs (with 37*48 held out, 48*37 is too),
and the eval split is drawn first, so it does not change when `num_train` grows.

    import verifiers as vf
    env = vf.load_environment("tool-arith", num_train=2000, num_eval=128, seed=0, max_turns=4)
"""

from __future__ import annotations

import ast
import operator
import random
from collections.abc import Callable
from typing import Any

import verifiers as vf
from datasets import Dataset

SYSTEM_PROMPT = "Reply with the number only."
LOW, HIGH = 10, 99  # the operands' range
MAX_EXPRESSION_CHARS = 200

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def question(a: int, b: int) -> str:
    return f"What is {a}*{b}?"


def _value(node: ast.AST) -> int | float:
    """The value of an expression node built only of numbers, + - * / // %, and parentheses."""
    if isinstance(node, ast.Constant):
        # bool is an int subclass and complex a number: neither is arithmetic on numbers here.
        if type(node.value) in (int, float):
            return node.value  # type: ignore[no-any-return]
        raise ValueError(f"only numbers are allowed, not {node.value!r}")
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        try:
            return _BINARY[type(node.op)](left, right)  # type: ignore[no-any-return]
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))  # type: ignore[no-any-return]
    what = (
        type(node.op).__name__ if isinstance(node, ast.BinOp | ast.UnaryOp) else type(node).__name__
    )
    raise ValueError(f"unsupported element {what!r}: use numbers, + - * / // % and parentheses")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression, e.g. "37*48".

    Args:
        expression: numbers joined by + - * / // % with parentheses.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {expression!r} ({err.msg})") from None
    return str(_value(tree.body))


def _content(message: Any) -> Any:
    return (
        message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    )


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


def correct_answer(completion: vf.Messages, answer: str) -> float:
    """1.0 when the last assistant message's text, stripped, is the answer."""
    replies = [m for m in completion if _role(m) == "assistant"]
    content = _content(replies[-1]) if replies else None
    return 1.0 if isinstance(content, str) and content.strip() == answer else 0.0


def _pairs(count: int, used: set[tuple[int, int]], rng: random.Random) -> list[tuple[int, int]]:
    """`count` unordered operand pairs not in `used` (updated in place), each in random order."""
    drawn: list[tuple[int, int]] = []
    while len(drawn) < count:
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        key = (min(a, b), max(a, b))
        if key not in used:
            used.add(key)
            drawn.append((a, b))
    return drawn


def make_splits(num_train: int, num_eval: int, seed: int) -> tuple[Dataset, Dataset]:
    """Disjoint train and eval datasets with `question` and `answer` columns."""
    span = HIGH - LOW + 1
    universe = span * (span + 1) // 2
    if num_train < 1 or num_eval < 1:
        raise ValueError(f"num_train and num_eval must be >= 1, got {num_train} and {num_eval}")
    if num_train + num_eval > universe:
        raise ValueError(f"num_train + num_eval = {num_train + num_eval}; only {universe} exist")
    rng = random.Random(seed)
    used: set[tuple[int, int]] = set()
    held_out = _pairs(num_eval, used, rng)
    training = _pairs(num_train, used, rng)

    def rows(pairs: list[tuple[int, int]]) -> Dataset:
        return Dataset.from_dict(
            {
                "question": [question(a, b) for a, b in pairs],
                "answer": [str(a * b) for a, b in pairs],
            }
        )

    return rows(training), rows(held_out)


def load_environment(
    num_train: int = 2000, num_eval: int = 128, seed: int = 0, max_turns: int = 4
) -> vf.Environment:
    dataset, eval_dataset = make_splits(num_train, num_eval, seed)
    return vf.ToolEnv(
        dataset=dataset,
        eval_dataset=eval_dataset,
        system_prompt=SYSTEM_PROMPT,
        tools=[calculate],
        max_turns=max_turns,
        rubric=vf.Rubric(funcs=[correct_answer]),
    )
