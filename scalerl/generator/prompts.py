"""Prompts a generator owns: reading the user's data (JSONL or Parquet, their own field names),
the held-out split, this generator's shard, turning a prompt into token ids (raw text or the
tokenizer's chat template), and the epoch order that skips prompts the no-positive-resampling
curriculum removed.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scalerl.datafile import PARQUET_SUFFIXES, Record, read_records
from scalerl.errors import DataError
from scalerl.recipe import NoPositiveResampling
from scalerl.rollout.position import EpochOrder
from scalerl.spec import DataSource, DataSpec, default_domain, domain_problem, reward_problem


@dataclass(frozen=True)
class Example:
    id: str
    prompt: str
    answer: str
    # Where the row is, "FILE:LINE" (or FILE:ROW for Parquet), for messages about it.
    source: str = field(default="", compare=False)
    # The reward the row is scored by and the domain its pass rate counts in: the row's own
    # `reward`/`domain` fields, else its source's (spec.data.train as a list), else the run's.
    reward: str = ""
    domain: str = ""
    # An environment's row (scalerl.agents): what its rollouts start from (prompt messages,
    # answer, info); None for a row of data.train.
    inputs: Mapping[str, Any] | None = field(default=None, compare=False)


def load_examples(
    path: str | Path,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    reward: str = "",
    domain: str | None = None,
) -> list[Example]:
    """Read a JSONL or Parquet file of prompts; a bad row is a DataError naming file and row, and
    so are ids used twice (data position, curriculum and evaluation records are keyed by id).

    A row's reward is its own `reward` field, else `reward`; its domain its own `domain` field,
    else `domain`, else its reward's name (`scalerl.spec.default_domain`); "" when neither a
    reward nor a domain is known (the caller's single reward applies)."""
    path = Path(path)
    examples = [
        _example(path, number, row, (prompt_field, answer_field), (reward, domain))
        for number, row in read_records(path)
    ]
    if not examples:
        raise DataError(f"{path}: no prompts in file")
    _ids_unique(path, examples)
    return examples


def _example(
    path: Path, number: int, row: Record, names: tuple[str, str], scored: tuple[str, str | None]
) -> Example:
    where = f"{path}:{number}"
    prompt_field, answer_field = names
    for name, setting in ((prompt_field, "promptField"), (answer_field, "answerField")):
        if name not in row:
            have = ", ".join(sorted(row))
            raise DataError(
                f"{where}: no field {name!r} (the row has: {have}); set spec.data.{setting}"
            )
        if row[name] is None:
            raise DataError(f"{where}: field {name!r} is null; give the row a value or drop it")
    raw_id = row.get("id")
    example_id = f"{path.stem}-{number}" if raw_id is None else str(raw_id)
    reward, domain = _scored_by(where, row, *scored)
    prompt, answer = str(row[prompt_field]), str(row[answer_field])
    return Example(example_id, prompt, answer, where, reward, domain)


def _scored_by(where: str, row: Record, reward: str, domain: str | None) -> tuple[str, str]:
    """The row's reward and domain: its own fields over the source's (checked like the spec's)."""
    for name, problem_of in (("reward", reward_problem), ("domain", domain_problem)):
        value = row.get(name)
        if value is None:
            continue
        problem = problem_of(value) if isinstance(value, str) else f"{value!r} is not a string"
        if problem:
            raise DataError(f"{where}: field {name!r}: {problem}")
    reward = row.get("reward") or reward
    domain = row.get("domain") or domain or (default_domain(reward) if reward else "")
    return reward, domain


def _ids_unique(path: Path, examples: list[Example]) -> None:
    rows: dict[str, list[str]] = {}
    for example in examples:
        rows.setdefault(example.id, []).append(example.source.rpartition(":")[2])
    twice = [(i, at) for i, at in rows.items() if len(at) > 1]
    if not twice:
        return
    unit = "rows" if path.suffix in PARQUET_SUFFIXES else "lines"
    shown = "; ".join(f"{i!r} on {unit} {', '.join(at)}" for i, at in twice[:3])
    more = f"; and {len(twice) - 3} more" if len(twice) > 3 else ""
    raise DataError(
        f"{path}: ids must be unique (data position, curriculum and evaluation records are "
        f"keyed by id): {shown}{more}"
    )


def load_sources(sources: Sequence[DataSource], data: DataSpec) -> list[list[Example]]:
    """Each source's rows, its reward and domain filled in. With several sources, a row's id is
    prefixed with its source's place in the list ("1:train-0"), so two files may use the same ids
    (the data position, curriculum and evaluation records are keyed by id)."""
    fields = (data.prompt_field, data.answer_field)
    loaded = []
    for i, s in enumerate(sources):
        rows = load_examples(s.path, *fields, reward=s.reward or data.reward, domain=s.domain)
        if len(sources) > 1:
            rows = [replace(e, id=f"{i}:{e.id}") for e in rows]
        loaded.append(rows)
    return loaded


def _held_out_files(data: DataSpec) -> list[Example]:
    """data.validation.path's rows: validation.prompts of them, shared evenly among its files
    (the first files take one more when it does not divide)."""
    sources = data.held_out()
    wanted = data.validation.prompts
    shares = [wanted // len(sources) + (i < wanted % len(sources)) for i in range(len(sources))]
    validation = []
    for source, rows, share in zip(sources, load_sources(sources, data), shares, strict=True):
        # Refused, not cut short: validation.prompts is the evaluation protocol runs are compared
        # by (a sweep's variants, a run against the paper's 1,000), and its noise; a run that
        # evaluated 5 while its spec says 1000 would be read as the run it is not.
        if len(rows) < share:
            if len(sources) == 1:
                fix = f"set it to {len(rows)} or add rows"
                asked = f"({wanted})"
            else:
                fix = "lower it or add rows"
                asked = f"({wanted}, shared by {len(sources)} files: {share} each)"
            raise DataError(
                f"{source.path}: {len(rows)} held-out prompts, fewer than "
                f"spec.data.validation.prompts {asked}; {fix}"
            )
        validation += rows[:share]
    return validation


def train_and_validation(data: DataSpec, seed: int) -> tuple[list[Example], list[Example]]:
    """The train prompts and the held-out prompts (from their own files, or held out of train)."""
    train = [e for rows in load_sources(data.train_sources(), data) for e in rows]
    wanted = data.validation.prompts
    if data.validation.path is not None:
        return train, _held_out_files(data)
    if wanted >= len(train):
        where = data.train if isinstance(data.train, str) else "spec.data.train"
        raise DataError(
            f"{where}: {len(train)} prompts cannot hold out {wanted} for validation; "
            "set spec.data.validation.path or lower spec.data.validation.prompts"
        )
    order = list(range(len(train)))
    random.Random(seed).shuffle(order)
    held = set(order[:wanted])
    return [e for i, e in enumerate(train) if i not in held], [train[i] for i in order[:wanted]]


# The one line for spec.data.chatTemplate: true with a tokenizer that has no template (`where`:
# " at MODEL" when the folder is known).
NO_CHAT_TEMPLATE = (
    "spec.data.chatTemplate: the tokenizer{where} has no chat template; set chatTemplate: false "
    "to send raw prompts"
)


def shard(examples: list[Example], index: int, count: int) -> list[Example]:
    """Generator `index` of `count` owns every count-th example."""
    return examples[index::count]


def chat_text(tokenizer: Any, prompt: str, system_prompt: str | None) -> str:
    """`prompt` as a user turn (after the system turn, if any), formatted by the tokenizer's own
    chat template with the assistant's generation prompt."""
    messages = [{"role": "user", "content": prompt}]
    if system_prompt is not None:
        messages.insert(0, {"role": "system", "content": system_prompt})
    text: str = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text


@dataclass(frozen=True)
class PromptEncoder:
    """Prompt text -> the token ids the engine sees.

    Raw text (base models) gets the tokenizer's BOS, if it has one, and nothing else; with
    `chat_template` the prompt becomes a user turn (after an optional system turn) formatted by
    the tokenizer's own template with the assistant's generation prompt, which carries whatever
    special tokens the template writes. A prompt longer than `max_tokens` is an error, never cut:
    a cut prompt silently changes the task.
    """

    tokenizer: Any
    max_tokens: int
    chat_template: bool = False
    system_prompt: str | None = None

    @classmethod
    def for_data(cls, tokenizer: Any, data: DataSpec, max_tokens: int) -> PromptEncoder:
        return cls(tokenizer, max_tokens, data.chat_template, data.system_prompt)

    def ids(self, prompt: str) -> list[int]:
        """Token ids of `prompt`, without the length check."""
        return self.batch_ids([prompt])[0]

    def batch_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        """Token ids of many prompts at once (the tokenizer batches them natively)."""
        if not prompts:
            return []
        if self.chat_template:
            if not getattr(self.tokenizer, "chat_template", None):
                raise DataError(NO_CHAT_TEMPLATE.format(where=""))
            texts = [chat_text(self.tokenizer, p, self.system_prompt) for p in prompts]
            return [list(i) for i in self.tokenizer(texts, add_special_tokens=False).input_ids]
        bos = self.tokenizer.bos_token_id
        encoded = self.tokenizer(list(prompts), add_special_tokens=False).input_ids
        return [list(i) if bos is None or i[:1] == [bos] else [bos, *i] for i in encoded]

    def encode(self, example: Example) -> list[int]:
        ids = self.ids(example.prompt)
        if len(ids) > self.max_tokens:
            raise DataError(
                f"prompt {example.id!r} is {len(ids)} tokens, over "
                f"spec.recipe.length.maxPromptTokens ({self.max_tokens})"
            )
        return ids

    def longest(self, examples: Sequence[Example], chunk: int = 4096) -> int:
        """Tokens of the longest prompt among `examples`; DataError if one formats to nothing."""
        longest = 0
        for start in range(0, len(examples), chunk):
            part = examples[start : start + chunk]
            sizes = [len(ids) for ids in self.batch_ids([e.prompt for e in part])]
            problem = empty_prompt_problem(part, sizes)
            if problem is not None:
                raise DataError(problem)
            longest = max(longest, *sizes)
        return longest


def empty_prompt_problem(examples: Sequence[Example], sizes: Sequence[int]) -> str | None:
    """Why prompts that are 0 tokens once formatted (an empty text, no BOS, no chat template)
    cannot run, naming their rows; None when there are none. The engine cannot sample from an
    empty prompt, so such a run would fail on its first batch, and again at every restart."""
    empty = [e for e, size in zip(examples, sizes, strict=True) if size == 0]
    if not empty:
        return None
    shown = ", ".join(f"{e.source or e.id} (id {e.id!r})" for e in empty[:3])
    more = f" and {len(empty) - 3} more" if len(empty) > 3 else ""
    return (
        f"{len(empty)} prompt(s) are empty once formatted (0 tokens: nothing for the engine to "
        f"sample from): {shown}{more}; give them text or drop them"
    )


class PromptOrder(EpochOrder[Example]):
    """A generator's shard of the train prompts, epoch after epoch from the run's data position
    (`scalerl.rollout.position`), skipping prompts the curriculum removed (when it is enabled).
    Yields (example, epoch)."""

    def __init__(
        self,
        examples: list[Example],
        curriculum: NoPositiveResampling | None,
        seed: str,
        served: Mapping[str, Iterable[int]] | None = None,
    ) -> None:
        if not examples:
            raise DataError("this generator's shard of the train prompts is empty")
        super().__init__(examples, _example_id, seed, served, curriculum)

    def __iter__(self) -> Iterator[tuple[Example, int]]:
        yield from super().__iter__()
        raise DataError(
            "every prompt of this generator's shard reached the no-positive-resampling "
            "threshold; nothing is left to train on"
        )


def _example_id(example: Example) -> str:
    return example.id
