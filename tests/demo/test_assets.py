"""prepare_demo: builds once, caches by parameters, survives racing callers; base model in band."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.demo import assets
from scalerl.demo.assets import DemoAssets, DemoParams, default_cache_dir, prepare_demo
from scalerl.demo.model import TinyModelShape
from scalerl.demo.task import read_jsonl
from scalerl.demo.warmup import WarmupConfig
from scalerl.generator.rewards import answer_text, exact

# A few warm-up steps on a smaller model: enough to exercise the whole build in seconds.
QUICK = DemoParams(
    train=64,
    validation=16,
    shape=TinyModelShape(hidden=32, intermediate=64, heads=2),
    warmup=WarmupConfig(steps=3, batch=8, warmup_steps=1),
)


def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    built: list[Path] = []
    real_build = assets._build

    def counting_build(directory: Path, params: DemoParams) -> dict[str, object]:
        built.append(directory)
        return real_build(directory, params)

    monkeypatch.setattr(assets, "_build", counting_build)
    return built


def test_second_call_reuses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = count_builds(monkeypatch)
    first = prepare_demo(tmp_path, QUICK)
    assert len(built) == 1
    assert (first.model_path / "model.safetensors").is_file()
    assert (first.model_path / "tokenizer.json").is_file()
    assert len(read_jsonl(first.train_path)) == 64
    assert len(read_jsonl(first.validation_path)) == 16
    assert prepare_demo(tmp_path, QUICK) == first
    assert len(built) == 1
    assert [p.name for p in tmp_path.iterdir()] == [first.model_path.parent.name]


def test_other_parameters_get_their_own_entry(tmp_path: Path) -> None:
    first = prepare_demo(tmp_path, QUICK)
    other = prepare_demo(tmp_path, DemoParams(**{**QUICK.__dict__, "seed": 1}))
    assert other.model_path.parent != first.model_path.parent
    assert read_jsonl(other.validation_path) != read_jsonl(first.validation_path)


def test_the_build_is_deterministic(tmp_path: Path) -> None:
    one = prepare_demo(tmp_path / "one", QUICK)
    two = prepare_demo(tmp_path / "two", QUICK)
    assert one.train_path.read_bytes() == two.train_path.read_bytes()
    a = load_file(str(one.model_path / "model.safetensors"))
    b = load_file(str(two.model_path / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_racing_callers_both_get_one_complete_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    barrier = threading.Barrier(2, timeout=60)
    real_build = assets._build

    def build_in_lockstep(directory: Path, params: DemoParams) -> dict[str, object]:
        facts = real_build(directory, params)
        barrier.wait()  # both builds finish before either renames: one rename must lose
        return facts

    monkeypatch.setattr(assets, "_build", build_in_lockstep)
    results: list[DemoAssets] = []
    threads = [
        threading.Thread(target=lambda: results.append(prepare_demo(tmp_path, QUICK)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0] == results[1]
    assert (results[0].model_path / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [results[0].model_path.parent.name]


def test_default_cache_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCALERL_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("SCALERL_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "scalerl"


def test_scratch_of_killed_builds_is_swept(tmp_path: Path) -> None:
    old, fresh = tmp_path / ".building-old", tmp_path / ".building-fresh"
    old.mkdir()
    fresh.mkdir()  # may belong to a build still running in another process
    os.utime(old, (time.time() - 2 * assets.ABANDONED_AFTER_SECONDS,) * 2)
    prepare_demo(tmp_path, QUICK)
    assert not old.exists() and fresh.exists()


@pytest.fixture(scope="session")
def demo_assets() -> DemoAssets:
    """The real default assets in the shared cache: only the first build pays (~30 s)."""
    return prepare_demo(default_cache_dir())


@torch.no_grad()
def test_base_model_pass_rate_is_low_but_not_zero(demo_assets: DemoAssets) -> None:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(str(demo_assets.model_path))
    model = AutoModelForCausalLM.from_pretrained(str(demo_assets.model_path)).eval()
    rows = read_jsonl(demo_assets.validation_path)[:64]
    samples = 8
    contexts = [
        [tokenizer.bos_token_id, *tokenizer(row["prompt"], add_special_tokens=False).input_ids]
        for row in rows
    ]
    width = max(len(c) for c in contexts)
    # Left padding, so every row's completion starts at column `width`.
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(c)) + c for c in contexts])
    attention_mask = (input_ids != tokenizer.pad_token_id).long()
    out = model.generate(
        input_ids=input_ids.repeat_interleave(samples, 0),
        attention_mask=attention_mask.repeat_interleave(samples, 0),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=12,
    )
    rewards = []
    for i, completion in enumerate(out[:, width:].tolist()):
        if tokenizer.eos_token_id in completion:
            completion = completion[: completion.index(tokenizer.eos_token_id) + 1]
        text = tokenizer.decode(completion, skip_special_tokens=True)
        rewards.append(exact(answer_text(text), rows[i // samples]["answer"]))
    pass_rate = sum(r > 0 for r in rewards) / len(rewards)
    assert 0.03 <= pass_rate <= 0.5, pass_rate
