"""The engine's KV cache on a CPU: room for vLLM's 256 sequences of the run's longest (in whole
blocks of 128 tokens), sized from the model's own shape (vLLM zeroes all of it at every start),
within 32 MiB and 1 GiB."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.generator.engine_config import EngineConfig, cpu_kv_cache_bytes
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.spec import LengthSpec

MiB = 2**20


def config(model: Path, max_model_len: int, dtype: str = "float32", **more: object) -> EngineConfig:
    return EngineConfig(
        model_path=str(model),
        dtype=dtype,  # type: ignore[arg-type]
        fp32_lm_head=False,
        max_model_len=max_model_len,
        temperature=1.0,
        seed=0,
        phrase="",
        plan=InterruptionPlan.of(LengthSpec()),
        **more,  # type: ignore[arg-type]
    )


def kv_bytes_per_token(model: Path, width: int) -> int:
    """Independently of the model's config: each layer's key and value projections' outputs."""
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    layers = hf.model.layers
    return sum(
        (layer.self_attn.k_proj.out_features + layer.self_attn.v_proj.out_features) * width
        for layer in layers
    )


@pytest.mark.parametrize(
    ("shape", "length", "dtype"),
    [
        (TinyModelShape(), 121, "float32"),  # the demo's: 64 MiB for 256 x 128 tokens
        (TinyModelShape(hidden=256, layers=4, heads=8, kv_heads=2), 1000, "bfloat16"),  # GQA
        (TinyModelShape(hidden=64, layers=1, heads=2), 64, "float32"),  # below the floor
        (TinyModelShape(hidden=512, layers=8, heads=8), 4096, "float32"),  # above the cap
    ],
)
def test_the_kv_cache_holds_256_of_the_longest_sequences(
    tmp_path: Path, shape: TinyModelShape, length: int, dtype: str
) -> None:
    model = build_random_model(tmp_path / "model", shape=shape)
    width = 4 if dtype == "float32" else 2
    blocks = math.ceil(length / 128)  # vLLM's CPU block: a sequence takes whole ones
    wanted = kv_bytes_per_token(model, width) * blocks * 128 * 256
    got = cpu_kv_cache_bytes(config(model, length, dtype))
    assert got == min(1024 * MiB, max(32 * MiB, wanted))


def test_a_size_given_is_kept_and_a_model_without_a_shape_gets_the_most(tmp_path: Path) -> None:
    model = build_random_model(tmp_path / "model")
    assert cpu_kv_cache_bytes(config(model, 121, kv_cache_bytes=5 * MiB)) == 5 * MiB
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"model_type": "no-such-architecture"}')
    assert cpu_kv_cache_bytes(config(tmp_path / "odd", 121)) == 1024 * MiB
