"""The chat-arith built-in: a byte-level BPE chat model on Parquet number-comparison data, checked
as a user would check their own model before training it, and its cached build."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
)

from scalerl.demo import arith, assets, bpe
from scalerl.demo.assets import (
    ChatArithParams,
    DemoAssets,
    chat_arith_framing,
    default_cache_dir,
    prepare_chat_arith,
)
from scalerl.demo.builtins import known_names, resolve_builtin
from scalerl.demo.model import TinyModelShape
from scalerl.demo.warmup import IGNORE, WarmupConfig, encode_batch
from scalerl.errors import DataError, InputError
from scalerl.generator.prompts import PromptEncoder, load_examples
from scalerl.spec import DataSpec

# A few warm-up steps on a smaller model: enough to exercise the whole build in seconds.
QUICK = ChatArithParams(
    train=64,
    validation=16,
    shape=TinyModelShape(hidden=32, layers=1, heads=1, intermediate=64, max_positions=96),
    warmup=WarmupConfig(steps=2, batch=8, warmup_steps=1),
)
QUESTION = re.compile(r"^Which is larger, (\d+) or (\d+)\?$")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    rows, _ = arith.make_splits(arith.LargerTask(), train=500, validation=10, seed=0)
    return bpe.build_tokenizer([arith.SYSTEM_PROMPT, *(r["question"] for r in rows)])


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> DemoAssets:
    return prepare_chat_arith(tmp_path_factory.mktemp("cache"), QUICK)


def chat(prompt: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": arith.SYSTEM_PROMPT},
        {"role": "user", "content": prompt},
    ]


# --- tokenizer -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=40))
def test_any_unicode_text_round_trips(tokenizer: PreTrainedTokenizerFast, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text


def test_merges_are_learned_but_digits_stay_single_tokens(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    tokens = tokenizer.tokenize("What is 37 + 105?")
    assert len(tokens) < len("What is 37 + 105?")  # BPE merged something
    assert [t for t in tokens if t.strip("Ġ").isdigit()] == ["3", "7", "1", "0", "5"]


def test_special_tokens_are_distinct_and_last(tokenizer: PreTrainedTokenizerFast) -> None:
    assert tokenizer.bos_token is None and tokenizer.bos_token_id is None
    assert tokenizer.eos_token == bpe.END_OF_TEXT
    assert tokenizer.pad_token_id not in (tokenizer.eos_token_id, 0)
    end, eos = bpe.end_ids(tokenizer)
    assert end != eos and tokenizer.convert_ids_to_tokens(end) == bpe.END
    special = tokenizer.convert_tokens_to_ids(bpe.SPECIAL_TOKENS)
    assert sorted(special) == list(range(len(tokenizer) - len(special), len(tokenizer)))


def test_chat_template_ends_with_the_assistant_prompt(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    text = tokenizer.apply_chat_template(
        chat("What is 2 + 3?"), tokenize=False, add_generation_prompt=True
    )
    assert text == (
        f"<|system|>\n{arith.SYSTEM_PROMPT}<|end|>\n"
        "<|user|>\nWhat is 2 + 3?<|end|>\n"
        "<|assistant|>\n"
    )
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids[-2:]) == bpe.GENERATION_PROMPT
    assert tokenizer.decode(ids, skip_special_tokens=True) == (
        f"\n{arith.SYSTEM_PROMPT}\n\nWhat is 2 + 3?\n\n"
    )


def test_chat_template_refuses_an_unknown_role(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(Exception, match="unknown chat role: tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


# --- task and data -------------------------------------------------------------------------------


def test_answers_are_the_larger_of_two_different_numbers() -> None:
    train, validation = arith.make_splits(arith.LargerTask(), train=2000, validation=256, seed=0)
    for row in train + validation:
        match = QUESTION.match(row["question"])
        assert match is not None, row
        a, b = int(match[1]), int(match[2])
        assert a != b and row["solution"] == str(max(a, b))
    lengths = {len(row["solution"]) for row in train}
    assert lengths == {1, 2}


def test_splits_are_disjoint_as_unordered_pairs() -> None:
    train, validation = arith.make_splits(arith.LargerTask(), train=3000, validation=256, seed=0)

    def pairs(rows: list[arith.Row]) -> set[frozenset[str]]:
        return {frozenset(QUESTION.match(r["question"]).groups()) for r in rows}  # type: ignore[union-attr]

    assert len(pairs(train)) == 3000 and len(pairs(validation)) == 256
    assert not pairs(train) & pairs(validation)


def test_validation_does_not_change_when_train_grows() -> None:
    task = arith.LargerTask()
    _, small = arith.make_splits(task, train=10, validation=50, seed=3)
    _, large = arith.make_splits(task, train=3000, validation=50, seed=3)
    assert small == large


def test_asking_for_more_pairs_than_exist_is_an_input_error() -> None:
    with pytest.raises(InputError, match="only 3"):
        arith.make_splits(arith.LargerTask(max_operand=2), train=3, validation=1, seed=0)


def test_parquet_files_have_the_fields_and_no_overlap(quick: DemoAssets) -> None:
    import pyarrow.parquet as pq

    for path, rows in ((quick.train_path, 64), (quick.validation_path, 16)):
        assert path.suffix == ".parquet"
        table = pq.read_table(path)
        assert table.column_names == ["id", "question", "solution"]
        assert table.num_rows == rows
    train = {r["question"] for r in arith.read_parquet(quick.train_path)}
    validation = {r["question"] for r in arith.read_parquet(quick.validation_path)}
    assert not train & validation


def test_the_engine_reads_the_parquet_fields(quick: DemoAssets) -> None:
    examples = load_examples(quick.validation_path, "question", "solution")
    assert [(e.id, e.answer) for e in examples[:1]] == [
        ("validation-0", arith.read_parquet(quick.validation_path)[0]["solution"])
    ]


def test_read_parquet_names_a_missing_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["What is 1 + 1?"]}), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="no column 'solution'"):
        arith.read_parquet(tmp_path / "bad.parquet")
    with pytest.raises(DataError, match="cannot read"):
        arith.read_parquet(tmp_path / "missing.parquet")


# --- the model folder ----------------------------------------------------------------------------


def test_model_folder_names_its_own_end_tokens(quick: DemoAssets) -> None:
    loaded = AutoTokenizer.from_pretrained(str(quick.model_path))
    config = json.loads((quick.model_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == bpe.CHAT_TEMPLATE  # in tokenizer_config.json itself
    assert not (quick.model_path / "chat_template.jinja").exists()
    generation = GenerationConfig.from_pretrained(str(quick.model_path))
    assert generation.eos_token_id == bpe.end_ids(loaded)
    assert loaded.eos_token_id in generation.eos_token_id
    model_config = json.loads((quick.model_path / "config.json").read_text())
    assert model_config["max_position_embeddings"] == 96
    assert model_config["model_type"] == "llama" and model_config["bos_token_id"] is None


def test_warmup_trains_the_prompt_the_engine_sends(quick: DemoAssets) -> None:
    loaded = AutoTokenizer.from_pretrained(str(quick.model_path))
    framing = chat_arith_framing(loaded)
    data = DataSpec(train="t.parquet", chat_template=True, system_prompt=arith.SYSTEM_PROMPT)
    encoder = PromptEncoder.for_data(loaded, data, max_tokens=64)
    for prompt in ("What is 37 + 48?", "What is 0 + 9?"):
        assert framing.context(prompt) == encoder.ids(prompt)


def test_warmup_labels_the_digits_then_the_turn_end(quick: DemoAssets) -> None:
    loaded = AutoTokenizer.from_pretrained(str(quick.model_path))
    framing = chat_arith_framing(loaded)
    batch = encode_batch(framing, [("What is 37 + 48?", "85")], arith.DIGITS, 1.0, random.Random(0))
    labels = batch.labels[0][batch.labels[0] != IGNORE].tolist()
    assert loaded.decode(labels) == f"85{bpe.END}"
    assert loaded.decode(batch.labels[0][batch.blurred[0]].tolist()) == "85"
    context = framing.context("What is 37 + 48?")
    assert batch.input_ids[0, : len(context)].tolist() == context


# --- the cached build ----------------------------------------------------------------------------


def test_second_call_reuses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Path] = []
    real_build = assets._build_chat_arith

    def counting_build(directory: Path, params: ChatArithParams) -> dict[str, object]:
        built.append(directory)
        return real_build(directory, params)

    monkeypatch.setattr(assets, "_build_chat_arith", counting_build)
    first = prepare_chat_arith(tmp_path, QUICK)
    assert prepare_chat_arith(tmp_path, QUICK) == first
    assert len(built) == 1
    assert [p.name for p in tmp_path.iterdir()] == [f"chat-arith-{QUICK.key()}"]
    assert (first.model_path / "model.safetensors").is_file()


@pytest.mark.parametrize(
    "name", ["builtin:nope", "builtin:chat-arith/test", "builtin:demo/", "builtin:"]
)
def test_unknown_builtins_are_data_errors_listing_the_known_ones(name: str) -> None:
    with pytest.raises(DataError, match="builtin:chat-arith/validation") as err:
        resolve_builtin(name)
    assert "builtin:demo/train" in str(err.value)


def test_known_names_cover_every_builtin() -> None:
    assert known_names() == [
        "builtin:demo",
        "builtin:demo/train",
        "builtin:demo/validation",
        "builtin:chat-arith",
        "builtin:chat-arith/train",
        "builtin:chat-arith/validation",
        "builtin:chat-arith-25m",
        "builtin:chat-arith-25m/train",
        "builtin:chat-arith-25m/validation",
        "builtin:code",
        "builtin:code/train",
        "builtin:code/validation",
        "builtin:math-code",
        "builtin:math-code/train",
        "builtin:math-code/validation",
        "builtin:tool-arith",  # a model only: its data comes from an environment
    ]


# --- the real base model -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chat_arith_assets() -> DemoAssets:
    """The real default assets in the shared cache: only the first build pays (~1 min)."""
    return prepare_chat_arith(default_cache_dir())


def sampled_pass_rate(model_path: Path, validation: Path, prompts: int, samples: int) -> float:
    """Held-out pass rate at temperature 1, sampled with HF generate as the run would sample."""
    torch.manual_seed(0)
    loaded = AutoTokenizer.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path)).eval()
    framing = chat_arith_framing(loaded)
    rows = arith.read_parquet(validation)[:prompts]
    contexts = [framing.context(row["question"]) for row in rows]
    width, pad = max(len(c) for c in contexts), loaded.pad_token_id
    # Left padding, so every row's completion starts at column `width`.
    input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids.repeat_interleave(samples, 0),
            attention_mask=(input_ids != pad).long().repeat_interleave(samples, 0),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=6,
            pad_token_id=pad,
        )  # stops at either id of generation_config.json's eos_token_id
    ends = set(bpe.end_ids(loaded))
    right = 0
    for i, completion in enumerate(out[:, width:].tolist()):
        stop = next((k for k, t in enumerate(completion) if t in ends), len(completion))
        answer = loaded.decode(completion[:stop], skip_special_tokens=True).strip()
        right += answer == rows[i // samples]["solution"]
    return right / out.shape[0]


def test_base_model_pass_rate_is_low_but_not_zero(chat_arith_assets: DemoAssets) -> None:
    rate = sampled_pass_rate(
        chat_arith_assets.model_path, chat_arith_assets.validation_path, prompts=64, samples=8
    )
    assert 0.05 <= rate <= 0.4, rate


def test_builtin_names_resolve_to_the_cached_assets(chat_arith_assets: DemoAssets) -> None:
    assert resolve_builtin("builtin:chat-arith") == chat_arith_assets.model_path
    assert resolve_builtin("builtin:chat-arith/train") == chat_arith_assets.train_path
    assert resolve_builtin("builtin:chat-arith/validation") == chat_arith_assets.validation_path
