"""With `reward: code`, `scalerl validate --deep` checks that every row holds tests, naming the
rows that do not (a bad row found mid-run would stop the run)."""

from __future__ import annotations

import json
from pathlib import Path

from test_preflight import problems, run_of

GOOD = json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})


def _write(tmp_path: Path, answers: list[str]) -> Path:
    rows = [{"question": f"task {i}", "solution": a} for i, a in enumerate(answers)]
    path = tmp_path / "code.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_with_tests_pass_and_rows_without_are_named(user_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = user_model()
    good = _write(tmp_path, [GOOD] * 20)
    assert problems(run_of(model, good, data={"reward": "code"})) == []
    answers = [GOOD] * 20
    answers[3] = "42"
    answers[7] = json.dumps({"inputs": ["1"], "outputs": []})
    found = problems(run_of(model, _write(tmp_path, answers), data={"reward": "code"}))
    assert found == [
        f"spec.data.answerField: {tmp_path / 'code.jsonl'}:4: code tests must be a JSON object "
        "or list, not int",
        f"spec.data.answerField: {tmp_path / 'code.jsonl'}:8: code tests: 1 inputs but 0 outputs",
    ]


def test_many_bad_rows_are_counted_after_the_first_five(user_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    train = _write(tmp_path, ["not tests"] * 12)
    found = problems(run_of(user_model(), train, data={"reward": "code"}))
    assert len(found) == 6 and found[-1] == "spec.data.answerField: 7 more rows without code tests"
