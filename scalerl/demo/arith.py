"""The second built-in task: the larger of two different numbers below 100, asked in a chat.

Chosen to share nothing with the demo's string reversal but the exact-match reward: the answer is
decided by comparing digits (tens first, then units) rather than by position, it takes one or two
tokens, and the data is Parquet with the field names many published datasets use (`question`,
`solution`). A 3-layer, hidden-128 Llama learns it in a minute or two on 2 CPU cores when digits
are separate tokens. (Addition is too hard at this size: after 1,200 warm-up steps such a model
answers only ~7 % of held-out sums right even greedily, so RL has no mode to sharpen.)

Splits are disjoint as unordered pairs: with `3 + 48` held out, `48 + 3` is held out too, so a
held-out question cannot be answered from a memorised mirror image.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from scalerl.datafile import read_records
from scalerl.errors import DataError, InputError

TRAIN_FILE = "train.parquet"
VALIDATION_FILE = "validation.parquet"
PROMPT_FIELD = "question"
ANSWER_FIELD = "solution"
SYSTEM_PROMPT = "Reply with the larger number only."
DIGITS = "0123456789"

Row = dict[str, str]


@dataclass(frozen=True)
class LargerTask:
    """Which of two different whole numbers in `0..max_operand` is larger; the answer is it."""

    max_operand: int = 99

    def question(self, a: int, b: int) -> str:
        return f"Which is larger, {a} or {b}?"

    def row(self, a: int, b: int, row_id: str) -> Row:
        return {"id": row_id, PROMPT_FIELD: self.question(a, b), ANSWER_FIELD: str(max(a, b))}

    def pairs(self) -> int:
        """How many unordered pairs of different numbers exist."""
        n = self.max_operand + 1
        return n * (n - 1) // 2


def _draw_pairs(
    task: LargerTask, count: int, used: set[tuple[int, int]], rng: random.Random
) -> list[tuple[int, int]]:
    """`count` unordered pairs not in `used` (updated in place), each in a random order."""
    drawn: list[tuple[int, int]] = []
    while len(drawn) < count:
        a, b = rng.randint(0, task.max_operand), rng.randint(0, task.max_operand)
        key = (min(a, b), max(a, b))
        if a == b or key in used:
            continue
        used.add(key)
        drawn.append((a, b))
    return drawn


def make_splits(
    task: LargerTask, *, train: int, validation: int, seed: int
) -> tuple[list[Row], list[Row]]:
    """Deterministic train and validation rows whose unordered pairs are disjoint.

    Validation is drawn first, so it does not change when only the training set grows.
    """
    if task.max_operand < 1:
        raise InputError(f"max_operand must be >= 1, got {task.max_operand}")
    if train < 1 or validation < 1:
        raise InputError(f"train and validation sizes must be >= 1, got {train} and {validation}")
    if train + validation > task.pairs():
        raise InputError(
            f"asked for {train + validation} distinct pairs but the task has only {task.pairs()}"
        )
    rng = random.Random(seed)
    used: set[tuple[int, int]] = set()
    held_out = _draw_pairs(task, validation, used, rng)
    training = _draw_pairs(task, train, used, rng)
    return (
        [task.row(a, b, f"train-{i}") for i, (a, b) in enumerate(training)],
        [task.row(a, b, f"validation-{i}") for i, (a, b) in enumerate(held_out)],
    )


def write_parquet(path: Path, rows: list[Row]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = ("id", PROMPT_FIELD, ANSWER_FIELD)
    table = pa.table({c: pa.array([row[c] for row in rows], pa.string()) for c in columns})
    pq.write_table(table, path)


def read_parquet(path: Path) -> list[Row]:
    """Rows of a task file; it must have string `question` and `solution` columns."""
    rows: list[Row] = [row for _, row in read_records(Path(path))]
    missing = {PROMPT_FIELD, ANSWER_FIELD} - set(rows[0] if rows else ())
    if missing:
        raise DataError(f"{path}: no column {sorted(missing)[0]!r}")
    return rows


def write_task(
    directory: Path, *, train: int, validation: int, seed: int, task: LargerTask
) -> tuple[Path, Path]:
    """Write `train.parquet` and `validation.parquet` into `directory`; return their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    training, held_out = make_splits(task, train=train, validation=validation, seed=seed)
    paths = directory / TRAIN_FILE, directory / VALIDATION_FILE
    write_parquet(paths[0], training)
    write_parquet(paths[1], held_out)
    return paths
