"""Prompts a generator owns: loading the JSONL files, the held-out split, this generator's shard,
and the epoch order that skips prompts the no-positive-resampling curriculum removed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from scalerl.errors import DataError
from scalerl.recipe import NoPositiveResampling
from scalerl.spec import DataSpec


@dataclass(frozen=True)
class Example:
    id: str
    prompt: str
    answer: str


def load_examples(path: str | Path) -> list[Example]:
    """Read `{"prompt": ..., "answer": ...}` per line; a bad line is a DataError naming it."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise DataError(f"{path}: cannot read prompts ({err.strerror})") from None
    examples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, answer = row["prompt"], row["answer"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(
                f'{path}:{number}: expected a JSON object with "prompt" and "answer" ({err})'
            ) from None
        examples.append(
            Example(str(row.get("id", f"{path.stem}-{number}")), str(prompt), str(answer))
        )
    if not examples:
        raise DataError(f"{path}: no prompts in file")
    return examples


def train_and_validation(data: DataSpec, seed: int) -> tuple[list[Example], list[Example]]:
    """The train prompts and the held-out prompts (from their own file, or held out of train)."""
    train = load_examples(data.train)
    wanted = data.validation.prompts
    if data.validation.path is not None:
        return train, load_examples(data.validation.path)[:wanted]
    if wanted >= len(train):
        raise DataError(
            f"{data.train}: {len(train)} prompts cannot hold out {wanted} for validation; "
            "set spec.data.validation.path or lower spec.data.validation.prompts"
        )
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    held = set(order[:wanted])
    return [e for i, e in enumerate(train) if i not in held], [train[i] for i in order[:wanted]]


def shard(examples: list[Example], index: int, count: int) -> list[Example]:
    """Generator `index` of `count` owns every count-th example."""
    return examples[index::count]


class PromptOrder:
    """Endless epochs over a shard, reshuffled each epoch, skipping prompts the curriculum
    removed."""

    def __init__(
        self, examples: list[Example], curriculum: NoPositiveResampling, seed: int
    ) -> None:
        if not examples:
            raise DataError("this generator's shard of the train prompts is empty")
        self.examples = examples
        self.curriculum = curriculum
        self.rng = random.Random(seed)
        self.epoch = 0

    def __iter__(self) -> Iterator[Example]:
        while True:
            active = [e for e in self.examples if self.curriculum.is_active(e.id)]
            if not active:
                raise DataError(
                    "every prompt of this generator's shard reached the no-positive-resampling "
                    "threshold; nothing is left to train on"
                )
            self.rng.shuffle(active)
            yield from active
            self.epoch += 1
