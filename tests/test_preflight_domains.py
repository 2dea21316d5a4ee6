"""`scalerl validate --deep` over a run of several domains: every source's file, every reward a
source or a row names, and code tests in the rows scored by code only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_preflight import ROWS, problems, run_of, write_data


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_two_sources_with_their_rewards_pass(user_model, tmp_path: Path) -> None:
    math = write_data(tmp_path)
    words = _jsonl(tmp_path / "words.jsonl", ROWS[:20])
    obj = run_of(user_model(), math)
    obj["spec"]["data"]["train"] = [{"path": str(math), "reward": "math"}, {"path": str(words)}]
    assert problems(obj) == []


def test_each_missing_source_is_named_by_its_place(user_model, tmp_path: Path) -> None:
    math = write_data(tmp_path)
    obj = run_of(user_model(), math)
    obj["spec"]["data"]["train"] = [{"path": str(math)}, {"path": str(tmp_path / "code.jsonl")}]
    obj["spec"]["data"]["validation"] = {"path": [{"path": str(tmp_path / "v.jsonl")}]}
    assert problems(obj) == [
        f"spec.data.train.1.path: {tmp_path / 'code.jsonl'} does not exist",
        f"spec.data.validation.path.0.path: {tmp_path / 'v.jsonl'} does not exist",
    ]


def test_a_reward_a_row_names_must_resolve_and_code_rows_need_tests(
    user_model, tmp_path: Path
) -> None:
    rows = [dict(r) for r in ROWS]
    rows[3]["reward"] = "no_such_module:score"
    rows[5]["reward"] = "code"  # its answer ("5+5=" -> "10") holds no tests
    obj = run_of(user_model(), _jsonl(tmp_path / "train.jsonl", rows))
    found = problems(obj)
    assert found[0].startswith(
        f"{tmp_path / 'train.jsonl'}:4: field 'reward': reward 'no_such_module:score': cannot "
        "import module 'no_such_module'"
    ), found
    assert found[1].startswith(f"spec.data.answerField: {tmp_path / 'train.jsonl'}:6: "), found
    assert len(found) == 2
