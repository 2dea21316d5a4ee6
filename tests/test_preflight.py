"""Everything a run needs is checked before any process starts: one line per problem, exit 2.

Each case is one a new user hit with their own model (EOS `<eos>`, a 64-token context, with and
without a single-token `</think>`, JSONL or Parquet data with their own field names).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from scalerl import preflight
from scalerl.cli import main
from scalerl.spec import parse_run

ROWS = [{"question": f"{i % 10}+{i % 7}=", "solution": str(i % 10 + i % 7)} for i in range(40)]


def write_data(tmp_path: Path, kind: str = "jsonl") -> Path:
    if kind == "parquet":
        path = tmp_path / "train.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        path = tmp_path / "train.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def run_of(model: Path, train: Path, **spec: Any) -> dict[str, Any]:
    """A small run on the user's model and data (answers of 1-2 tokens, no thinking)."""
    body: dict[str, Any] = {
        "model": {"path": str(model), "dtype": "float32", "thinkEnd": None},
        "data": {
            "train": str(train),
            "promptField": "question",
            "answerField": "solution",
            "validation": {"prompts": 8},
            "reward": "exact",
        },
        "recipe": {
            "length": {"maxPromptTokens": 16, "answerBudget": 8, "interruption": {"enabled": False}}
        },
        "generators": {"replicas": 2, "gpus": 0},
        "trainers": {"replicas": 1, "gpus": 0},
    }
    for key, value in spec.items():
        body[key] = {**body.get(key, {}), **value}
    return {
        "apiVersion": "scalerl.dev/v1alpha1",
        "kind": "ScaleRLRun",
        "metadata": {"name": "u"},
        "spec": body,
    }


def problems(obj: dict[str, Any]) -> list[str]:
    return preflight.problems_of(parse_run(obj))


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_users_model_and_data_pass(user_model, tmp_path: Path, kind: str) -> None:
    assert problems(run_of(user_model(), write_data(tmp_path, kind))) == []


def test_budgets_over_the_models_context_are_one_line_naming_both(user_model, tmp_path) -> None:
    # The reproduced bug: vLLM died with "max_model_len (152) > derived 64" in a log.
    obj = run_of(user_model(max_positions=64), write_data(tmp_path))
    obj["spec"]["recipe"]["length"]["answerBudget"] = 61
    [line] = problems(obj)
    assert line.startswith("spec.recipe.length: the longest prompt (4 tokens)")
    assert "needs 65 tokens, over the model's max_position_embeddings 64" in line


def test_a_multi_token_think_end_is_named(user_model, tmp_path: Path) -> None:
    obj = run_of(user_model(), write_data(tmp_path))
    obj["spec"]["model"]["thinkEnd"] = "</think>"
    obj["spec"]["recipe"]["length"] = {
        "thinkingBudget": 8,
        "answerBudget": 8,
        "maxPromptTokens": 16,
        "interruption": {"enabled": False},
    }
    [line] = problems(obj)
    assert line.startswith("spec.model.thinkEnd: '</think>' is 8 tokens")


def test_a_thinking_model_counts_the_interruption_phrase(user_model, tmp_path: Path) -> None:
    obj = run_of(user_model(think_end="</think>", max_positions=512), write_data(tmp_path))
    obj["spec"]["model"]["thinkEnd"] = "</think>"
    obj["spec"]["recipe"]["length"] = {
        "maxPromptTokens": 16,
        "thinkingBudget": 16,
        "answerBudget": 8,
        "interruption": {"enabled": True, "window": [12, 16]},
    }
    run = parse_run(obj)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run.spec.model.path)
    phrase = len(tokenizer.encode(run.spec.interruption_phrase, add_special_tokens=False))
    assert preflight.model_len_needed(run.spec, tokenizer, 5) == 5 + 16 + 8 + phrase
    assert problems(obj) == []


def test_every_problem_is_listed_at_once(user_model, tmp_path: Path) -> None:
    obj = run_of(user_model(), write_data(tmp_path))
    obj["spec"]["data"]["answerField"] = "answer"
    obj["spec"]["data"]["reward"] = "no_such_module:score"
    obj["spec"]["data"]["chatTemplate"] = True
    found = problems(obj)
    assert any(p.startswith("spec.data: ") and "no field 'answer'" in p for p in found)
    assert any(p.startswith("spec.data.reward: ") for p in found)
    assert any(p.startswith("spec.data.chatTemplate: ") and "no chat template" in p for p in found)


def test_prompts_longer_than_max_prompt_tokens_are_counted(user_model, tmp_path: Path) -> None:
    obj = run_of(user_model(max_positions=512), write_data(tmp_path))
    obj["spec"]["recipe"]["length"]["maxPromptTokens"] = 3
    [line] = problems(obj)
    assert line.startswith("spec.recipe.length.maxPromptTokens: ")
    assert "40 of 40 prompts are longer than 3 tokens (longest 4)" in line


def test_missing_model_and_data_are_named(tmp_path: Path) -> None:
    found = problems(run_of(tmp_path / "nowhere", tmp_path / "none.jsonl"))
    assert f"spec.model.path: {tmp_path / 'nowhere'} does not exist" in found[0]
    assert any(p == f"spec.data.train: {tmp_path / 'none.jsonl'} does not exist" for p in found)


def test_validate_deep_prints_one_line_per_problem_and_exits_2(
    user_model, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = run_of(user_model(max_positions=16), write_data(tmp_path))
    obj["spec"]["data"]["promptField"] = "prompt"
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(obj))
    assert main(["validate", str(path)]) == 0  # the spec alone is fine
    capsys.readouterr()
    assert main(["validate", "--deep", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "no field 'prompt'" in err[0] and "Traceback" not in err[0]


# --- data that would run wrong or fail after start-up ------------------------------------------


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_fewer_validation_rows_than_validation_prompts_names_both(user_model, tmp_path) -> None:
    # B6: 5 rows against the default 1000 evaluated 5, and `--deep` said valid.
    val = write_rows(tmp_path / "val.jsonl", ROWS[:5])
    obj = run_of(user_model(), write_data(tmp_path))
    obj["spec"]["data"]["validation"] = {"path": str(val), "prompts": 1000}
    assert problems(obj) == [
        f"spec.data: {val}: 5 held-out prompts, fewer than spec.data.validation.prompts (1000); "
        "set it to 5 or add rows"
    ]
    obj["spec"]["data"]["validation"]["prompts"] = 5
    assert problems(obj) == []


def test_a_prompt_empty_once_formatted_names_its_row(user_model, tmp_path, chat_template) -> None:
    # B7: with a tokenizer without BOS an empty prompt is 0 tokens; the run failed on its first
    # batch, after start-up, and again at every restart.
    rows = [*ROWS[:2], {"question": "", "solution": "0"}, *ROWS[3:]]
    train = write_rows(tmp_path / "train.jsonl", rows)
    assert problems(run_of(user_model(), train)) == [
        f"spec.data: 1 prompt(s) are empty once formatted (0 tokens: nothing for the engine to "
        f"sample from): {train}:3 (id 'train-3'); give them text or drop them"
    ]
    # The chat template makes it a user turn of its own tokens: a prompt the model can answer.
    templated = run_of(user_model("chat", chat_template=chat_template), train)
    templated["spec"]["data"]["chatTemplate"] = True
    assert problems(templated) == []


def test_ids_used_twice_are_named_with_their_lines(user_model, tmp_path: Path) -> None:
    # B8: prompts sharing an id were conflated by the data position, curriculum and records.
    rows = [{**r, "id": ["a", "b", "a", "c", "b", "a"][i]} for i, r in enumerate(ROWS[:6])]
    train = write_rows(tmp_path / "train.jsonl", rows + ROWS[6:])
    assert problems(run_of(user_model(), train)) == [
        f"spec.data: {train}: ids must be unique (data position, curriculum and evaluation "
        "records are keyed by id): 'a' on lines 1, 3, 6; 'b' on lines 2, 5"
    ]


def test_a_null_answer_says_it_is_null(user_model, tmp_path: Path) -> None:
    # B9: it said "no field 'solution' (the row has: question, solution)".
    train = write_rows(tmp_path / "train.jsonl", [*ROWS[:3], {**ROWS[3], "solution": None}])
    assert problems(run_of(user_model(), train)) == [
        f"spec.data: {train}:4: field 'solution' is null; give the row a value or drop it"
    ]


def test_a_missing_chat_template_is_one_line(user_model, tmp_path: Path) -> None:
    # B19: a second line followed, transformers' long message about the same missing template.
    model = user_model()
    obj = run_of(model, write_data(tmp_path))
    obj["spec"]["data"]["chatTemplate"] = True
    assert problems(obj) == [
        f"spec.data.chatTemplate: the tokenizer at {model} has no chat template; set "
        "chatTemplate: false to send raw prompts"
    ]


def test_scalerl_run_refuses_bad_data_before_starting_anything(
    user_model, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same checks hold for a run: it stops at once with the line, not after start-up.
    train = write_rows(tmp_path / "train.jsonl", [*ROWS[:3], {**ROWS[3], "solution": None}])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run_of(user_model(), train)))
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: spec.data: {train}:4: field 'solution' is null; give the row a value or drop it"
    ]
    assert not (tmp_path / "out").exists()
