"""The demo task: reverse a short word over a small alphabet.

Chosen because a 2-layer, hidden-128 Llama learns it in well under a minute on 2 CPU cores (it is
pure positional copying), answers are checked by exact match, and completions are tiny
(`</think>` + at most `max_length` letters + EOS), so sampling is cheap. The validation split is
disjoint from the training split, word for word, so held-out pass rate measures the skill, not
memory.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from scalerl.datafile import read_records
from scalerl.errors import DataError, InputError

TRAIN_FILE = "train.jsonl"
VALIDATION_FILE = "val.jsonl"


@dataclass(frozen=True)
class ReverseTask:
    """Words of `min_length`..`max_length` letters from `alphabet`; the answer reverses them."""

    alphabet: str = "abcdefgh"
    min_length: int = 3
    max_length: int = 5
    instruction: str = "reverse: "

    def prompt(self, word: str) -> str:
        return f"{self.instruction}{word}"

    def answer(self, word: str) -> str:
        return word[::-1]

    def lengths(self) -> range:
        return range(self.min_length, self.max_length + 1)

    def words_of_length(self, length: int) -> int:
        # int(): `int ** int` is typed Any (a negative power would be a float).
        return int(len(self.alphabet) ** length)

    def example(self, word: str, example_id: str) -> dict[str, str]:
        return {"id": example_id, "prompt": self.prompt(word), "answer": self.answer(word)}


@dataclass(frozen=True)
class TaskFiles:
    train_path: Path
    validation_path: Path


def _check(task: ReverseTask, total: int) -> None:
    if not task.alphabet or len(set(task.alphabet)) != len(task.alphabet):
        raise InputError(f"task alphabet {task.alphabet!r} must be non-empty with distinct letters")
    if not 1 <= task.min_length <= task.max_length:
        raise InputError(
            f"task lengths must satisfy 1 <= min_length <= max_length, got "
            f"{task.min_length}..{task.max_length}"
        )
    universe = sum(task.words_of_length(n) for n in task.lengths())
    if total > universe:
        raise InputError(
            f"asked for {total} distinct words but the task has only {universe}; "
            "use fewer examples, a longer alphabet or longer words"
        )


def draw_words(task: ReverseTask, count: int, used: set[str], rng: random.Random) -> list[str]:
    """`count` distinct words not in `used` (updated in place), lengths as uniform as pools allow.

    Uniform lengths (not uniform words) keep short words common enough that every length is
    learned; a length whose pool is exhausted is skipped.
    """
    taken = {n: sum(1 for w in used if len(w) == n) for n in task.lengths()}
    words: list[str] = []
    while len(words) < count:
        open_lengths = [n for n in task.lengths() if taken[n] < task.words_of_length(n)]
        if not open_lengths:
            raise InputError(f"the task has no unused words left after {len(words)} of {count}")
        length = rng.choice(open_lengths)
        word = "".join(rng.choice(task.alphabet) for _ in range(length))
        if word in used:
            continue
        used.add(word)
        taken[length] += 1
        words.append(word)
    return words


def make_splits(
    task: ReverseTask, *, train: int, validation: int, seed: int
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Deterministic, disjoint train and validation examples.

    Validation words are drawn first so that the held-out set does not change when only the
    training set grows.
    """
    if train < 1 or validation < 1:
        raise InputError(f"train and validation sizes must be >= 1, got {train} and {validation}")
    _check(task, train + validation)
    rng = random.Random(seed)
    used: set[str] = set()
    held_out = draw_words(task, validation, used, rng)
    training = draw_words(task, train, used, rng)
    return (
        [task.example(w, f"train-{i}") for i, w in enumerate(training)],
        [task.example(w, f"val-{i}") for i, w in enumerate(held_out)],
    )


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict[str, str]]:
    """Read a task file; every line must be an object with string `prompt` and `answer`."""
    rows: list[dict[str, str]] = []
    for number, row in read_records(Path(path)):
        if not all(isinstance(row.get(k), str) for k in ("prompt", "answer")):
            raise DataError(
                f"{path}:{number}: expected an object with string 'prompt' and 'answer'"
            )
        rows.append(row)
    return rows


def write_task(
    directory: Path,
    *,
    train: int = 4000,
    validation: int = 256,
    seed: int = 0,
    task: ReverseTask = ReverseTask(),
) -> TaskFiles:
    """Write `train.jsonl` and `val.jsonl` for `task` into `directory`; return their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    training, held_out = make_splits(task, train=train, validation=validation, seed=seed)
    files = TaskFiles(directory / TRAIN_FILE, directory / VALIDATION_FILE)
    write_jsonl(files.train_path, training)
    write_jsonl(files.validation_path, held_out)
    return files
