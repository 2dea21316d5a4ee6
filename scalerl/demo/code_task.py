"""The code built-in's task: write a two-line Python function `f` over a list of whole numbers
(`xs`) or a string of letters (`s`), judged by call-based tests (`reward: code`).

Each family is a sentence and the expression `f` returns, with one or two whole-number constants:
"the sum of the numbers in xs above 37" is `sum(x for x in xs if x > 37)`. The constants make the
space large (11,059 problems) and are what the warmed-up model gets wrong: its warm-up blurs
digits (scalerl.demo.warmup), so it writes the right program around a wrong constant now and then,
and RL has to sharpen the digits it copies from the sentence into the code.

A row is `{"id", "prompt", "answer", "solution", "family", "constants"}`: the prompt is a Python
comment naming `f`'s argument and what it returns, the answer the tests as JSON in the call-based
shape (`{"fn_name": "f", "inputs": [[arg], ...], "outputs": [...]}`), the solution the program the
warm-up teaches. Expected outputs come from evaluating the family's expression here, on inputs
chosen so that every program a one-digit slip in a constant makes fails at least one test (a test
that the wrong constant passed would reward a wrong program). Validation problems are drawn first
and never appear in training; the validation file interleaves the families, so any prefix of it
(`data.validation.prompts`) is balanced.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.datafile import read_records
from scalerl.errors import DataError, InputError

TRAIN_FILE = "train.jsonl"
VALIDATION_FILE = "validation.jsonl"
FN_NAME = "f"
DIGITS = "0123456789"
LETTERS = string.ascii_lowercase
MAX_VALUE = 99  # list elements are whole numbers 0..99
MAX_LIST = 9
MAX_STRING = 18  # longer than any string constant (<= 15) plus one
CASES = 4
EXTRA_CASE_TRIES = 8  # inputs drawn to tell a constant from its one-digit slips before giving up

Row = dict[str, Any]
Constants = tuple[int, ...]


@dataclass(frozen=True)
class Family:
    """Problems `f(arg)` returning `code` (a Python expression) with constants `{a}` (and `{b}`)
    in `low..high`; with two constants, `a + 2 <= b` (a range with something inside)."""

    name: str
    arg: str  # "xs" or "s"
    says: str
    code: str
    low: int
    high: int

    @property
    def pair(self) -> bool:
        return "{b}" in self.code

    def instances(self) -> list[Constants]:
        values = range(self.low, self.high + 1)
        if self.pair:
            return [(a, b) for a in values for b in values if a + 2 <= b]
        return [(a,) for a in values]

    def fill(self, text: str, constants: Constants) -> str:
        return text.format(**dict(zip("ab", map(str, constants), strict=False)))

    def prompt(self, constants: Constants) -> str:
        return f"# {FN_NAME}({self.arg}) returns {self.fill(self.says, constants)}\n"

    def solution(self, constants: Constants) -> str:
        return f"def {FN_NAME}({self.arg}):\n    return {self.fill(self.code, constants)}"

    def function(self) -> Callable[..., Any]:
        """The expression as a function of the argument and the constants, compiled once (our own
        template code, evaluated in this process to compute the tests' expected outputs)."""
        body = self.code.format(a="a", b="b")
        compiled: Callable[..., Any] = eval(f"lambda {self.arg}, a=0, b=0: {body}")  # noqa: S307
        return compiled


FAMILIES: tuple[Family, ...] = (
    Family("sum_above", "xs", "the sum of the numbers in xs above {a}",
           "sum(x for x in xs if x > {a})", 0, 98),
    Family("sum_below", "xs", "the sum of the numbers in xs below {a}",
           "sum(x for x in xs if x < {a})", 2, 99),  # below 1 sums only zeros, as below 0 does
    Family("count_above", "xs", "how many numbers in xs are above {a}",
           "len([x for x in xs if x > {a}])", 0, 98),
    Family("count_below", "xs", "how many numbers in xs are below {a}",
           "len([x for x in xs if x < {a}])", 1, 99),
    Family("keep_above", "xs", "the numbers in xs above {a}",
           "[x for x in xs if x > {a}]", 0, 98),
    Family("keep_below", "xs", "the numbers in xs below {a}",
           "[x for x in xs if x < {a}]", 1, 99),
    Family("count_of", "xs", "how many times {a} is in xs", "xs.count({a})", 0, 99),
    Family("plus", "xs", "each number in xs plus {a}", "[x + {a} for x in xs]", 1, 99),
    Family("minus", "xs", "each number in xs minus {a}", "[x - {a} for x in xs]", 1, 99),
    Family("times", "xs", "each number in xs times {a}", "[x * {a} for x in xs]", 2, 99),
    Family("modulo", "xs", "each number in xs modulo {a}", "[x % {a} for x in xs]", 2, 99),
    Family("sum_multiples", "xs", "the sum of the multiples of {a} in xs",
           "sum(x for x in xs if x % {a} == 0)", 2, 99),
    Family("keep_between", "xs", "the numbers in xs between {a} and {b}",
           "[x for x in xs if {a} < x < {b}]", 0, 99),
    Family("count_between", "xs", "how many numbers in xs are between {a} and {b}",
           "len([x for x in xs if {a} < x < {b}])", 0, 99),
    Family("first", "xs", "the first {a} numbers of xs", "xs[:{a}]", 1, 7),
    Family("s_first", "s", "the first {a} letters of s", "s[:{a}]", 1, 15),
    Family("s_last", "s", "the last {a} letters of s", "s[-{a}:]", 1, 15),
    Family("s_drop", "s", "s without its first {a} letters", "s[{a}:]", 1, 15),
    Family("s_rotate", "s", "s rotated left by {a} letters", "s[{a}:] + s[:{a}]", 1, 15),
    Family("s_slice", "s", "the letters of s from {a} up to {b}", "s[{a}:{b}]", 0, 15),
)  # fmt: skip


@dataclass(frozen=True)
class CodeTask:
    """How many problems of each family go to each split (fewer where a family has fewer: at
    most a quarter of a family is held out)."""

    train_per_family: int = 160
    validation_per_family: int = 12
    seed: int = 0


# --- tests ------------------------------------------------------------------------------------


def slips(constants: Constants) -> Iterator[Constants]:
    """Every constant tuple that differs from `constants` by one digit of one constant (no
    leading zeros: `07` is not a Python number), and by one either way."""
    for i, value in enumerate(constants):
        text = str(value)
        near = {value - 1, value + 1}
        for pos, digit in ((p, d) for p in range(len(text)) for d in DIGITS):
            changed = text[:pos] + digit + text[pos + 1 :]
            if changed != text and not (len(changed) > 1 and changed[0] == "0"):
                near.add(int(changed))
        for other in sorted(near - {value}):
            if other >= 0:
                yield (*constants[:i], other, *constants[i + 1 :])


def _draw_input(family: Family, constants: Constants, rng: random.Random, edge: bool) -> Any:
    """One argument: random, or (`edge`) holding the values where a slip changes the result —
    each constant and its neighbours for lists, a long string for strings."""
    if family.arg == "s":
        length = rng.randint(MAX_STRING - 2, MAX_STRING) if edge else rng.randint(0, MAX_STRING)
        return "".join(rng.choice(LETTERS) for _ in range(length))
    length = rng.randint(MAX_LIST - 1, MAX_LIST) if edge else rng.randint(0, MAX_LIST)
    xs = [rng.randint(0, MAX_VALUE) for _ in range(length)]
    if edge:
        # Each constant, and each of its neighbours half the time (always both would make
        # `xs.count(50)` and `xs.count(51)` agree).
        near = [*constants, *(v + d for v in constants for d in (-1, 1) if rng.random() < 0.5)]
        spots = rng.sample(range(length), min(length, len(near)))
        for spot, value in zip(spots, near, strict=False):
            xs[spot] = min(MAX_VALUE, max(0, value))
    return xs


def _outputs(fn: Callable[..., Any], inputs: list[Any], constants: Constants) -> list[Any] | None:
    """What `fn` returns on each input with `constants`; None when it raises (a slip such as a
    modulo by 0 is a program that fails anyway)."""
    try:
        return [fn(arg, *constants) for arg in inputs]
    except (ArithmeticError, ValueError):
        return None


def _separating(
    family: Family, constants: Constants, passing: list[Constants], rng: random.Random
) -> Any:
    """A list with, for each slip that still passes, an element it gets wrong (`xs.count(80)`
    vs `xs.count(40)` needs a 40; random lists seldom hold one); a fresh long string for `s`."""
    if family.arg == "s":
        return _draw_input(family, constants, rng, edge=True)
    fn = family.function()

    def told(xs: list[int], slips: list[Constants]) -> bool:
        return all(_outputs(fn, [xs], other) != [fn(xs, *constants)] for other in slips)

    xs: list[int] = []
    done: list[Constants] = []
    for other in passing:
        if not told(xs, [other]):
            # An element that tells this slip apart without blurring the ones told before.
            values = rng.sample(range(MAX_VALUE + 1), MAX_VALUE + 1)
            found = next((v for v in values if told([*xs, v], [*done, other])), None)
            if found is None or len(xs) == MAX_LIST:
                break
            xs.append(found)
        done.append(other)
    return xs


def make_tests(family: Family, constants: Constants, rng: random.Random) -> dict[str, Any]:
    """Call-based tests of `family` with `constants` that every one-digit slip fails."""
    fn = family.function()
    inputs = [_draw_input(family, constants, rng, edge=n < 2) for n in range(CASES)]
    for _ in range(EXTRA_CASE_TRIES):
        outputs = _outputs(fn, inputs, constants)
        assert outputs is not None, (family.name, constants)  # instances never raise
        passing = [o for o in slips(constants) if _outputs(fn, inputs, o) == outputs]
        if not passing:
            return {"fn_name": FN_NAME, "inputs": [[arg] for arg in inputs], "outputs": outputs}
        inputs.append(_separating(family, constants, passing, rng))
    raise InputError(f"{family.name}{constants}: no tests tell it from its one-digit slips")


def make_row(family: Family, constants: Constants, row_id: str, rng: random.Random) -> Row:
    return {
        "id": row_id,
        "prompt": family.prompt(constants),
        "answer": json.dumps(make_tests(family, constants, rng), separators=(",", ":")),
        "solution": family.solution(constants),
        "family": family.name,
        "constants": list(constants),
    }


# --- splits -----------------------------------------------------------------------------------


def make_splits(task: CodeTask = CodeTask()) -> tuple[list[Row], list[Row]]:
    """Deterministic, disjoint training and validation rows; validation interleaves families."""
    if task.train_per_family < 1 or task.validation_per_family < 1:
        raise InputError(
            f"train_per_family and validation_per_family must be >= 1, got "
            f"{task.train_per_family} and {task.validation_per_family}"
        )
    rng = random.Random(task.seed)
    held: list[list[tuple[Family, Constants]]] = []
    training: list[tuple[Family, Constants]] = []
    for family in FAMILIES:
        pool = family.instances()
        rng.shuffle(pool)
        cut = min(task.validation_per_family, max(1, len(pool) // 4))
        held.append([(family, c) for c in pool[:cut]])
        training.extend((family, c) for c in pool[cut : cut + task.train_per_family])
    rng.shuffle(training)
    # Round robin over the families: the first N validation rows cover them all evenly.
    validation = [h[rank] for rank in range(max(map(len, held))) for h in held if rank < len(h)]
    return (
        [make_row(f, c, f"train-{i}", rng) for i, (f, c) in enumerate(training)],
        [make_row(f, c, f"validation-{i}", rng) for i, (f, c) in enumerate(validation)],
    )


def write_jsonl(path: Path, rows: list[Row]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_rows(path: Path) -> list[Row]:
    """The rows of a task file; each must hold string `prompt`, `answer` and `solution`."""
    rows: list[Row] = []
    for number, row in read_records(Path(path)):
        if not all(isinstance(row.get(k), str) for k in ("prompt", "answer", "solution")):
            raise DataError(
                f"{path}:{number}: expected an object with string 'prompt', 'answer' and 'solution'"
            )
        rows.append(row)
    return rows


def write_task(directory: Path, task: CodeTask = CodeTask()) -> tuple[Path, Path]:
    """Write `train.jsonl` and `validation.jsonl` for `task` into `directory`; their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    training, validation = make_splits(task)
    paths = directory / TRAIN_FILE, directory / VALIDATION_FILE
    write_jsonl(paths[0], training)
    write_jsonl(paths[1], validation)
    return paths
