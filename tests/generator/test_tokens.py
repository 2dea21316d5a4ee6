"""The model decides its own tokens: EOS ids from its tokenizer and generation config, the
end-of-thinking id from the spec, answers decoded without special tokens."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from scalerl.errors import DataError
from scalerl.generator.tokens import ModelTokens


def ids(tokenizer: object, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]


def test_eos_ids_come_from_the_tokenizer_and_the_generation_config(user_model) -> None:
    path = user_model()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokens = ModelTokens.load(path, tokenizer, None)
    assert tokens.eos_ids == set(tokenizer.convert_tokens_to_ids(["<eos>", "<|end|>"]))


def test_an_answer_never_contains_eos_text(user_model) -> None:
    # The reproduced bug: with EOS `<eos>` every answer read "15<eos>" and `exact` failed it.
    path = user_model()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokens = ModelTokens.load(path, tokenizer, None)
    assert tokens.answer_text(ids(tokenizer, "15") + [tokenizer.eos_token_id]) == "15"
    end_of_turn = tokenizer.convert_tokens_to_ids("<|end|>")
    assert tokens.answer_text(ids(tokenizer, " 7 ") + [end_of_turn]) == "7"


def test_a_thinking_model_answers_after_its_last_think_end(user_model) -> None:
    path = user_model(think_end="</think>")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokens = ModelTokens.load(path, tokenizer, "</think>")
    completion = ids(tokenizer, "hmm</think>no</think>42") + [tokenizer.eos_token_id]
    assert tokens.answer_text(completion) == "42"
    assert tokens.answer_text(ids(tokenizer, "still thinking")) == ""


def test_think_end_must_be_one_token(user_model) -> None:
    path = user_model()  # no `</think>` in this vocabulary: it splits into characters
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    with pytest.raises(DataError, match=r"spec.model.thinkEnd: '</think>' is 8 tokens"):
        ModelTokens.load(path, tokenizer, "</think>")


def test_a_model_without_any_eos_is_refused(user_model) -> None:
    path = user_model()
    (path / "generation_config.json").unlink()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    tokenizer.eos_token = None
    with pytest.raises(DataError, match="names an EOS token"):
        ModelTokens.load(path, tokenizer, None)
