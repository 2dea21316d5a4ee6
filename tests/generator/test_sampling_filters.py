"""Under every sampling setting an unchanged policy reads an importance ratio of 1: the trainer's
log-probs of the tokens the real vLLM engine sampled equal the log-probs the engine recorded.

vLLM records the log-probs of the distribution it sampled from (`processed_logprobs`): tempered,
then filtered by min-p, top-k and top-p and renormalised over the tokens kept. The trainer's
`Policy`, given the same temperature and filters (scalerl.recipe.sampling), scores the same
samples on the same float32 model; every trained token must agree within float error. The same
trainer without the setting (the plain tempered softmax, or no temperature) disagrees by the log
of the mass the filters dropped, so the test fails where the trainer ignores a setting.

slow: a real vLLM engine (CPU) on a tiny random Llama whose head is scaled so that a few tokens
carry most of the probability, as in a trained model (the filters then keep ~3-10 of 100 tokens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from scalerl.demo.model import build_random_model
from scalerl.generator.engine import DEFAULT_PHRASE, EngineConfig, GenerationEngine
from scalerl.recipe import InterruptionPlan, SamplingFilters
from scalerl.recipe.sampling import NO_FILTERS
from scalerl.rollout.records import RolloutGroup, Sample
from scalerl.trainer import build_batch, load_policy

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

HEAD_SCALE = 10.0  # logits' spread from ~0.2 (random init) to ~2: peaked, as a trained model's
PROMPTS = [[1, *range(10 + 3 * i, 22 + 3 * i)] for i in range(6)]
# |trainer log p - generator log p| of one trained token, both in float32 on the same weights.
FLOAT_ERROR = 1e-4
SETTINGS: dict[str, tuple[float, SamplingFilters]] = {
    "temperature 0.7": (0.7, NO_FILTERS),
    "top-p 0.8": (1.0, SamplingFilters(top_p=0.8)),
    "top-k 5": (1.0, SamplingFilters(top_k=5)),
    "min-p 0.1": (1.0, SamplingFilters(min_p=0.1)),
    "temperature 0.8, min-p 0.02, top-k 8, top-p 0.9": (
        0.8,
        SamplingFilters(top_p=0.9, top_k=8, min_p=0.02),
    ),
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GenerationEngine]:
    root = tmp_path_factory.mktemp("sampling-filters")
    path = build_random_model(root / "model", seed=3)
    model: Any = load_hf(path)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.save_pretrained(str(path), safe_serialization=True)
    config = EngineConfig(
        model_path=str(path),
        dtype="float32",
        fp32_lm_head=False,
        max_model_len=256,
        temperature=1.0,
        seed=0,
        phrase=DEFAULT_PHRASE,
        plan=InterruptionPlan(thinking_budget=16, answer_budget=8, window=(8, 16)),
        run_dir=str(root / "run"),
    )
    started = GenerationEngine(config)
    await started.start()
    yield started
    await started.shutdown()


def load_hf(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def trainer_gaps(
    engine: GenerationEngine,
    prompts: list[list[int]],
    groups: list[list[Sample]],
    temperature: float,
    filters: SamplingFilters,
) -> torch.Tensor:
    """|trainer log p - generator log p| of every trained token, the trainer's policy scoring
    with `temperature` and `filters`."""
    policy = load_policy(
        Path(engine.config.model_path),
        fp32_lm_head=False,
        temperature=temperature,
        filters=filters,
    )
    rollouts = [
        # Every sample scored, finished or not (a truncated one would leave the batch).
        RolloutGroup(f"p{i}", prompt, [dataclasses.replace(s, truncated=False) for s in g], 0)
        for i, (prompt, g) in enumerate(zip(prompts, groups, strict=True))
    ]
    batch, _ = build_batch(
        rollouts,
        current_version=0,
        max_off_policy=None,
        pad_id=policy.pad_id,
        drop_zero_variance=False,
    )
    assert batch is not None
    with torch.no_grad():
        logprobs, _ = policy.completion_logprobs(batch)
    mask = batch.loss_mask
    assert int(mask.sum()) == sum(sum(s.loss_mask) for g in groups for s in g)
    return (logprobs[mask] - batch.old_logprobs[mask]).abs()


@pytest.mark.parametrize("setting", SETTINGS)
async def test_an_unchanged_policy_reads_ratio_one_under_each_sampling_setting(
    engine: GenerationEngine, setting: str
) -> None:
    temperature, filters = SETTINGS[setting]
    # The engine reads its sampling settings per request: one engine serves every setting.
    engine.config = dataclasses.replace(engine.config, temperature=temperature, filters=filters)
    groups = [await engine.generate(prompt, 4, max_tokens=24) for prompt in PROMPTS]
    # Evaluations are sampled with the same settings (and the length rules, whose injected
    # interruption phrase is not trained and not compared).
    groups += await engine.evaluate(PROMPTS[:2], 2, seeds=["eval/0", "eval/1"])
    prompts = PROMPTS + PROMPTS[:2]
    matched = trainer_gaps(engine, prompts, groups, temperature, filters)
    # What the trainer would compute ignoring the setting: no filters (or no temperature).
    plain = 1.0 if not filters.on else temperature
    naive = trainer_gaps(engine, prompts, groups, plain, NO_FILTERS)
    print(
        f"\n{setting}: {matched.numel()} tokens; |delta log p| max {matched.max():.2e}, "
        f"mean {matched.mean():.2e}; without the setting: max {naive.max():.3f}, "
        f"mean {naive.mean():.3f}",
        end="",
    )
    assert float(matched.max()) <= FLOAT_ERROR
    # Without the setting the ratio of an unchanged policy is far from 1 on most tokens.
    assert float(naive.mean()) > 0.05 and float((naive > 100 * FLOAT_ERROR).float().mean()) > 0.5
