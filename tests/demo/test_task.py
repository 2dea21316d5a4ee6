"""The demo task: disjoint, deterministic splits whose answers the reward verifies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.demo.task import ReverseTask, make_splits, read_jsonl, write_task
from scalerl.errors import DataError, InputError
from scalerl.generator.rewards import answer_text, exact


def test_splits_are_disjoint() -> None:
    train, validation = make_splits(ReverseTask(), train=3000, validation=256, seed=0)
    train_prompts = {row["prompt"] for row in train}
    validation_prompts = {row["prompt"] for row in validation}
    assert len(train_prompts) == 3000 and len(validation_prompts) == 256
    assert not train_prompts & validation_prompts


def test_splits_are_deterministic_and_depend_on_the_seed() -> None:
    first = make_splits(ReverseTask(), train=100, validation=20, seed=7)
    assert first == make_splits(ReverseTask(), train=100, validation=20, seed=7)
    assert first != make_splits(ReverseTask(), train=100, validation=20, seed=8)


def test_validation_does_not_change_when_train_grows() -> None:
    _, small = make_splits(ReverseTask(), train=10, validation=50, seed=0)
    _, large = make_splits(ReverseTask(), train=2000, validation=50, seed=0)
    assert small == large


def test_every_word_length_is_represented() -> None:
    task = ReverseTask(alphabet="abc", min_length=1, max_length=4)
    train, _ = make_splits(task, train=90, validation=10, seed=0)
    lengths = {len(row["answer"]) for row in train}
    assert lengths == {1, 2, 3, 4}


def test_small_pools_are_exhausted_without_duplicates() -> None:
    task = ReverseTask(alphabet="ab", min_length=1, max_length=2)  # 2 + 4 = 6 words in all
    train, validation = make_splits(task, train=4, validation=2, seed=0)
    words = [row["answer"] for row in train + validation]
    assert sorted(words) == sorted(["a", "b", "aa", "ab", "ba", "bb"])


def test_answers_reverse_the_prompt_word_and_pass_the_reward() -> None:
    task = ReverseTask()
    train, validation = make_splits(task, train=50, validation=50, seed=0)
    for row in train + validation:
        word = row["prompt"].removeprefix(task.instruction)
        assert row["answer"] == word[::-1]
        completion = f"</think>{row['answer']}"
        assert exact(answer_text(completion), row["answer"]) == 1.0
        assert exact(answer_text(f"</think>{word}x"), row["answer"]) == -1.0


def test_write_task_writes_jsonl_splits(tmp_path: Path) -> None:
    files = write_task(tmp_path / "data", train=30, validation=10, seed=3)
    assert files.train_path.name == "train.jsonl" and files.validation_path.name == "val.jsonl"
    lines = files.train_path.read_text().splitlines()
    assert len(lines) == 30
    assert set(json.loads(lines[0])) == {"id", "prompt", "answer"}
    assert len(read_jsonl(files.validation_path)) == 10


def test_asking_for_more_words_than_exist_is_an_input_error() -> None:
    with pytest.raises(InputError, match="only 6"):
        make_splits(
            ReverseTask(alphabet="ab", min_length=1, max_length=2), train=6, validation=1, seed=0
        )


@pytest.mark.parametrize(
    "task", [ReverseTask(alphabet=""), ReverseTask(alphabet="aa"), ReverseTask(min_length=0)]
)
def test_bad_task_parameters_are_input_errors(task: ReverseTask) -> None:
    with pytest.raises(InputError):
        make_splits(task, train=1, validation=1, seed=0)


def test_read_jsonl_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "p", "answer": "a"}\n{"prompt": "p"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2"):
        read_jsonl(path)
    path.write_text("not json\n")
    with pytest.raises(DataError, match="not valid JSON"):
        read_jsonl(path)
    with pytest.raises(DataError, match="no such file"):
        read_jsonl(tmp_path / "missing.jsonl")
