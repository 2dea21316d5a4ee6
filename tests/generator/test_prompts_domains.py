"""Rows scored by their own reward: each source's rows take its reward and domain, a row's own
`reward`/`domain` fields win, ids stay unique across files, and held-out prompts are shared
evenly among the validation files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scalerl.errors import DataError
from scalerl.generator.prompts import load_examples, train_and_validation
from scalerl.spec import DataSpec


def _jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _rows(kind: str, n: int, **extra: object) -> list[dict[str, object]]:
    return [{"id": f"r{i}", "prompt": f"{kind} {i}", "answer": str(i), **extra} for i in range(n)]


def test_each_source_scores_its_rows_with_its_reward(tmp_path: Path) -> None:
    math = _jsonl(tmp_path / "math.jsonl", _rows("sum", 6))
    words = _jsonl(tmp_path / "words.jsonl", _rows("reverse", 4))
    data = DataSpec.model_validate(
        {
            "train": [{"path": math}, {"path": words, "reward": "exact", "domain": "words"}],
            "validation": {"prompts": 4},
            "reward": "math",
        }
    )
    train, held = train_and_validation(data, seed=1)
    every = {e.id: (e.reward, e.domain) for e in train + held}
    assert len(every) == 10  # both files use ids r0..: prefixed by their place in the list
    assert {i: every[i] for i in ("0:r0", "1:r0")} == {
        "0:r0": ("math", "math"),
        "1:r0": ("exact", "words"),
    }
    assert len(held) == 4 and not {e.id for e in held} & {e.id for e in train}


def test_a_rows_own_reward_and_domain_win(tmp_path: Path) -> None:
    rows = [
        {"prompt": "a", "answer": "1"},
        {"prompt": "b", "answer": "2", "reward": "code"},
        {"prompt": "c", "answer": "3", "reward": "code", "domain": "python"},
        {"prompt": "d", "answer": "4", "domain": "algebra"},
    ]
    examples = load_examples(_jsonl(tmp_path / "mixed.jsonl", rows), reward="math")
    assert [(e.reward, e.domain) for e in examples] == [
        ("math", "math"),
        ("code", "code"),  # a row naming its reward is in that reward's domain
        ("code", "python"),
        ("math", "algebra"),
    ]
    named = load_examples(_jsonl(tmp_path / "named.jsonl", rows[:2]), reward="math", domain="x")
    assert [e.domain for e in named] == ["x", "x"]  # the source's domain holds for its rows


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"reward": "bogus"}, "field 'reward': 'bogus' is not one of math, exact, code"),
        ({"reward": 1.0}, "field 'reward': 1.0 is not a string"),
        ({"domain": "Two Words"}, "field 'domain': 'Two Words' is not a domain name"),
    ],
)
def test_a_bad_row_reward_or_domain_is_named_by_file_and_line(
    tmp_path: Path, row: dict[str, object], message: str
) -> None:
    path = _jsonl(
        tmp_path / "bad.jsonl", [{"prompt": "a", "answer": "1"}] + [_rows("x", 1, **row)[0]]
    )
    with pytest.raises(DataError) as info:
        load_examples(path, reward="math")
    assert str(info.value).startswith(f"{path}:2: {message}"), str(info.value)


def test_validation_files_share_the_held_out_prompts_evenly(tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "train.jsonl", _rows("t", 3))
    a = _jsonl(tmp_path / "a.jsonl", _rows("a", 5))
    b = _jsonl(tmp_path / "b.jsonl", _rows("b", 2))
    sources = [{"path": a}, {"path": b, "reward": "exact"}]
    data = DataSpec.model_validate({"train": train, "validation": {"path": sources, "prompts": 4}})
    _, held = train_and_validation(data, seed=0)
    assert [(e.id, e.domain) for e in held] == [
        ("0:r0", "math"),
        ("0:r1", "math"),
        ("1:r0", "exact"),
        ("1:r1", "exact"),
    ]
    five = data.model_copy(update={"validation": data.validation.model_copy(update={"prompts": 5})})
    assert [e.id for e in train_and_validation(five, seed=0)[1]][:3] == ["0:r0", "0:r1", "0:r2"]
    six = data.model_copy(update={"validation": data.validation.model_copy(update={"prompts": 6})})
    with pytest.raises(DataError) as info:
        train_and_validation(six, seed=0)
    assert str(info.value) == (
        f"{b}: 2 held-out prompts, fewer than spec.data.validation.prompts (6, shared by 2 "
        "files: 3 each); lower it or add rows"
    )
