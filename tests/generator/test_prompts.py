"""Prompts as users have them: JSONL or Parquet, their own field names, raw text or the
tokenizer's chat template, and a clear error for a bad row or a prompt over the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from scalerl.errors import DataError
from scalerl.generator.prompts import Example, PromptEncoder, load_examples, train_and_validation
from scalerl.spec import DataSpec

ROWS = [{"question": f"{i}+{i}=", "solution": str(2 * i), "id": f"q{i}"} for i in range(5)]


def write_parquet(path: Path, rows: list[dict[str, object]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_parquet_and_jsonl_with_the_users_field_names(tmp_path: Path) -> None:
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    parquet = write_parquet(tmp_path / "train.parquet", ROWS)
    for path in (jsonl, parquet):
        examples = load_examples(path, "question", "solution")
        assert examples[3] == Example("q3", "3+3=", "6")


def test_a_missing_field_names_the_row_what_it_has_and_the_setting(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "train.parquet", ROWS)
    with pytest.raises(DataError) as info:
        load_examples(path, "prompt", "solution")
    message = str(info.value)
    assert f"{path}:1: no field 'prompt'" in message
    assert "question" in message and "spec.data.promptField" in message


def test_a_broken_jsonl_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "a", "answer": "b"}\n{not json\n')
    with pytest.raises(DataError, match=r"train.jsonl:2: not valid JSON"):
        load_examples(path)


def test_raw_prompts_get_bos_only_when_the_tokenizer_has_one(user_model) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(user_model()))
    assert tokenizer.bos_token_id is None
    encoder = PromptEncoder(tokenizer, max_tokens=32)
    assert encoder.ids("1+1=") == tokenizer.encode("1+1=", add_special_tokens=False)


def test_chat_template_formats_system_and_user_turns(user_model, chat_template: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(user_model(chat_template=chat_template)))
    encoder = PromptEncoder(tokenizer, 64, chat_template=True, system_prompt="Add.")
    text = tokenizer.decode(encoder.ids("1+1="))
    assert text == "<|system|>Add.<|end|><|user|>1+1=<|end|><|assistant|>"


def test_a_prompt_over_the_budget_is_an_error_not_a_silent_cut(user_model) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(user_model()))
    encoder = PromptEncoder(tokenizer, max_tokens=4)
    with pytest.raises(DataError, match=r"prompt 'long' is 9 tokens, over .*maxPromptTokens \(4\)"):
        encoder.encode(Example("long", "123456789", "x"))
    assert encoder.longest([Example("a", "12", "3"), Example("b", "12345", "6")]) == 5


# --- what the generators refuse at start-up, as `scalerl validate --deep` does ----------------


def test_a_null_field_is_called_null_and_a_missing_one_missing(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "train.parquet", [*ROWS[:2], {**ROWS[2], "solution": None}])
    with pytest.raises(DataError) as info:
        load_examples(path, "question", "solution")
    assert str(info.value) == f"{path}:3: field 'solution' is null; give the row a value or drop it"


def test_ids_used_twice_name_the_id_and_its_rows(tmp_path: Path) -> None:
    rows = [{**r, "id": "same" if i in (1, 4) else r["id"]} for i, r in enumerate(ROWS)]
    path = write_parquet(tmp_path / "train.parquet", rows)
    with pytest.raises(DataError, match=r"ids must be unique .*: 'same' on rows 2, 5$"):
        load_examples(path, "question", "solution")
    # Without an id column each row's id is its file and line: unique by construction.
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"prompt": "a", "answer": "b"}\n' * 3)
    assert [e.id for e in load_examples(plain)] == ["plain-1", "plain-2", "plain-3"]


def test_a_validation_file_shorter_than_its_count_is_refused(tmp_path: Path) -> None:
    train = write_parquet(tmp_path / "train.parquet", ROWS)
    val = write_parquet(tmp_path / "val.parquet", ROWS[:3])
    data = {"train": str(train), "promptField": "question", "answerField": "solution"}
    short = DataSpec.model_validate({**data, "validation": {"path": str(val), "prompts": 4}})
    with pytest.raises(DataError) as info:
        train_and_validation(short, seed=0)
    assert str(info.value) == (
        f"{val}: 3 held-out prompts, fewer than spec.data.validation.prompts (4); set it to 3 "
        "or add rows"
    )
    fits = DataSpec.model_validate({**data, "validation": {"path": str(val), "prompts": 2}})
    assert [e.id for e in train_and_validation(fits, seed=0)[1]] == ["q0", "q1"]


def test_a_generator_refuses_an_empty_prompt_before_sampling(user_model) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(user_model()))
    encoder = PromptEncoder(tokenizer, max_tokens=32)
    examples = [Example("a", "1+1=", "2"), Example("b", "", "0", "train.jsonl:7")]
    with pytest.raises(DataError, match=r"^1 prompt\(s\) are empty .*: train.jsonl:7 \(id 'b'\)"):
        encoder.longest(examples)


def test_no_chat_template_is_one_line_from_the_encoder(user_model) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(user_model()))
    encoder = PromptEncoder(tokenizer, 32, chat_template=True)
    with pytest.raises(DataError) as info:
        encoder.ids("1+1=")
    assert str(info.value) == (
        "spec.data.chatTemplate: the tokenizer has no chat template; set chatTemplate: false to "
        "send raw prompts"
    )
