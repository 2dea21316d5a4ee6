"""The FP32 LM head (paper: raises the asymptote 0.52 -> 0.61) narrows the gap between the
generator's and the trainer's log-probs of the same tokens.

A bf16 model is sampled by vLLM twice, with a bf16 head and with `head_dtype` float32; an HF
"trainer" computes the log-probs of the sampled tokens with the matching head. With FP32 heads on
both sides only the bf16 model bodies differ, so the mean |delta log p| per token must fall.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.generator.engine import DEFAULT_PHRASE, EngineConfig, GenerationEngine
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.recipe.mismatch import figures as figures_of
from scalerl.recipe.mismatch import mismatch_sums

# slow: a real vLLM engine (and a Hugging Face reference model) per module.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

SHAPE = TinyModelShape(hidden=256, layers=2, heads=4, intermediate=512)
# Random init gives near-uniform logits (|logit| ~ 0.2), where bf16 rounding barely shows;
# a scaled head gives the spread of a trained model's logits.
HEAD_SCALE = 24.0
PROMPTS = [[1, *range(10 + i, 22 + i)] for i in range(8)]
# Measured here: 7.1e-4 with bf16 heads, 3.1e-4 with FP32 heads (mean |delta log p| 0.019 and
# 0.014); a bound at about three times the bf16 figure.
STATED_BF16_KL = 2e-3


def ones(gaps: torch.Tensor) -> torch.Tensor:
    return torch.ones(1, len(gaps), dtype=torch.bool)


def zeros(gaps: torch.Tensor) -> torch.Tensor:
    return torch.zeros(1, len(gaps), dtype=torch.long)


def build_sharp_bf16_model(path: Path, kit: Any) -> Path:
    build_random_model(path, shape=SHAPE, dtype=torch.bfloat16, seed=7)
    model = kit.load_hf(path, torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


async def logprob_gaps(kit: Any, path: Path, *, fp32_head: bool) -> torch.Tensor:
    """HF log p - vLLM log p (trainer minus generator) of every sampled token, both sides with
    the same head dtype."""
    config = EngineConfig(
        model_path=str(path),
        dtype="bfloat16",
        fp32_lm_head=fp32_head,
        max_model_len=128,
        temperature=1.0,
        seed=0,
        phrase=DEFAULT_PHRASE,
        plan=InterruptionPlan(thinking_budget=32, answer_budget=8, window=(16, 32)),
        run_dir=str(kit.root / f"fp32-head-{fp32_head}"),
    )
    engine = GenerationEngine(config)
    await engine.start()
    try:
        groups = [await engine.generate(prompt, 8, max_tokens=32) for prompt in PROMPTS]
    finally:
        await engine.shutdown()
    trainer = kit.load_hf(path, torch.bfloat16)
    gaps = []
    for prompt, samples in zip(PROMPTS, groups, strict=True):
        for s in samples:
            expected = kit.hf_logprobs(trainer, prompt, s.completion_ids, fp32_head=fp32_head)
            gaps.append(expected - torch.tensor(s.logprobs))
    return torch.cat(gaps)


async def test_fp32_heads_on_both_sides_shrink_the_logprob_mismatch(kit: Any) -> None:
    path = build_sharp_bf16_model(kit.root / "bf16-sharp", kit)
    bf16 = await logprob_gaps(kit, path, fp32_head=False)
    fp32 = await logprob_gaps(kit, path, fp32_head=True)
    figures = {}
    for name, gaps in (("bf16 heads", bf16), ("fp32 heads", fp32)):
        # The run's own lag-0 mismatch figures (one policy version: every token is lag 0).
        sums = mismatch_sums(gaps[None, :], torch.zeros(1, len(gaps)), ones(gaps), zeros(gaps))
        figures[name] = f = figures_of(sums)[0]
        print(
            f"\n{name}: |delta log p| mean {f.abs_mean:.4f}, p99 {gaps.abs().quantile(0.99):.4f},"
            f" max {f.abs_max:.4f}; KL {f.kl:.2e}; ratio outside [0.8, 1.25] {f.outside:.2%}",
            end="",
        )
    bf16_f, fp32_f = figures["bf16 heads"], figures["fp32 heads"]
    print(f"\nmean {100 * (1 - fp32_f.abs_mean / bf16_f.abs_mean):.0f} % lower with fp32 heads")
    assert fp32_f.abs_mean < bf16_f.abs_mean and fp32_f.kl < bf16_f.kl
    # The stated bf16 figure (docs/recipes.md, "Train-inference mismatch"): this sharp bf16 model,
    # unchanged, reads a lag-0 KL under STATED_BF16_KL (float32 engines: under 1e-6,
    # tests/tracking/test_tracking_local_run.py).
    assert bf16_f.kl < STATED_BF16_KL
