"""LoRA on the real vLLM (CPU, punica_cpu kernels): the engine serves the trainer's adapter, and
a new version is a new adapter that lands in flight, in both placements. The engine's log-probs
are checked against the trainer's own with the adapter and against the base with the adapter
merged by PEFT; `scalerl export --merge` gives a model that computes what the engine served.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from peft import PeftModel
from transformers import PreTrainedModel

from scalerl.cli import main
from scalerl.demo.tokenizer import build_tokenizer
from scalerl.generator.colocation import Colocation
from scalerl.generator.engine import GenerationEngine
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.rollout.records import RolloutGroup, Sample
from scalerl.spec import LoraSpec
from scalerl.sync import WeightSender
from scalerl.trainer import Policy, build_batch, load_policy

# slow: real vLLM engines (and Hugging Face reference models).
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

TOKENIZER = build_tokenizer()
PROMPTS = [
    [TOKENIZER.bos_token_id, *TOKENIZER.encode(text, add_special_tokens=False)]
    for text in ("What is 2+3?", "Name a prime.", "Spell cat.", "Count to 4.")
]
TEMPERATURE = 0.8
LORA = LoraSpec(rank=8, alpha=16)
PLAN = InterruptionPlan(thinking_budget=16, answer_budget=12, window=(8, 16))


@dataclass
class Served:
    """The model on disk, the trainer's policy with its adapter, and PEFT's merge of it."""

    path: Path
    policy: Policy
    kit: Any
    merged: PreTrainedModel | None = None

    def new_adapter(self, seed: int, folder: Path) -> None:
        """The trainer's adapter after some training: random B (a fresh one is the base), saved
        to `folder`; `merged` becomes the base with it merged by PEFT."""
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, parameter in self.policy.model.named_parameters():
                if ".lora_B." in name:
                    parameter.normal_(0.0, 0.01)
        self.policy.save_adapter(folder)
        base = self.kit.load_hf(self.path)
        self.merged = PeftModel.from_pretrained(base, str(folder)).merge_and_unload().eval()

    def assert_served(self, samples: list[Sample], prompt: list[int]) -> None:
        assert self.merged is not None
        self.kit.assert_logprobs_match(self.merged, samples, prompt, TEMPERATURE)


@pytest.fixture(scope="module")
def served(kit: Any) -> Served:
    path = kit.make_thinking_model(kit.root / "thinking-lora")
    policy = load_policy(path, fp32_lm_head=False, temperature=TEMPERATURE, lora=LORA)
    return Served(path, policy, kit)


def engine_config(kit: Any, served: Served, name: str) -> Any:
    config = kit.thinking_engine(served.path, kit.root / name, TEMPERATURE, PLAN)
    return replace(config, lora=LORA)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def colocated(kit: Any, served: Served) -> AsyncIterator[tuple[GenerationEngine, Colocation]]:
    colocation = Colocation()
    engine = GenerationEngine(engine_config(kit, served, "lora-inproc"), colocation=colocation)
    await engine.start()
    yield engine, colocation
    await engine.shutdown()


async def hand_over(colocation: Colocation, policy: Policy, version: int) -> float:
    """What the colocated trainer does from its thread: the adapter, as a folder in memory."""
    return await asyncio.to_thread(colocation.load_adapter, policy.save_adapter, version, 30.0)


async def test_the_engine_serves_the_trainer_s_adapter(
    colocated: tuple[GenerationEngine, Colocation], served: Served, tmp_path: Path
) -> None:
    engine, colocation = colocated
    served.new_adapter(seed=1, folder=tmp_path / "v1")
    base = await engine.evaluate(PROMPTS[:1], 4)
    await hand_over(colocation, served.policy, 1)
    groups = await engine.evaluate(PROMPTS, 4)
    for prompt, samples in zip(PROMPTS, groups, strict=True):
        assert all(s.versions == [1] * len(s.completion_ids) for s in samples)
        served.assert_served(samples, prompt)
    # The trainer's own forward with the adapter scores the engine's samples the same.
    # Scored and counted whole (the random model runs to its budget), so the batch keeps them.
    scored = [
        replace(s, reward=1.0 if i % 2 else -1.0, truncated=False) for i, s in enumerate(groups[0])
    ]
    group = RolloutGroup(prompt_id="p", prompt_ids=PROMPTS[0], samples=scored, generator=0)
    batch, _ = build_batch([group], current_version=1, max_off_policy=None,
                           pad_id=served.policy.pad_id)  # fmt: skip
    assert batch is not None
    with torch.no_grad():
        trainer, _ = served.policy.completion_logprobs(batch)
    mask = batch.loss_mask
    torch.testing.assert_close(trainer[mask], batch.old_logprobs[mask], atol=1e-4, rtol=0)
    # ... and they are not the base's: the adapter changed what the engine computes.
    with pytest.raises(AssertionError):
        served.kit.assert_logprobs_match(served.kit.load_hf(served.path), groups[0], PROMPTS[0],
                                         TEMPERATURE)  # fmt: skip
    assert base[0][0].versions[0] == 0


async def test_a_new_adapter_lands_in_flight_and_requests_continue_on_it(
    colocated: tuple[GenerationEngine, Colocation], served: Served, tmp_path: Path
) -> None:
    engine, colocation = colocated
    if engine.version == 0:
        served.new_adapter(seed=1, folder=tmp_path / "v1")
        await hand_over(colocation, served.policy, 1)
    old, old_model = engine.version, served.merged
    assert old_model is not None
    running = [asyncio.ensure_future(engine.generate(p, 4, max_tokens=160)) for p in PROMPTS]
    while engine.pending_requests() < 16 and not any(r.done() for r in running):
        await asyncio.sleep(0.001)
    await engine.generate(PROMPTS[0], 1, max_tokens=2)  # every request has sampled 2 tokens
    served.new_adapter(seed=2, folder=tmp_path / "v2")
    seconds = await hand_over(colocation, served.policy, old + 1)
    groups = await asyncio.gather(*running)
    print(f"\nin-memory adapter update (save + load): {seconds * 1000:.1f} ms")
    switched = sum(
        served.kit.check_swap(s, prompt, old_model, served.merged, old, TEMPERATURE)
        for prompt, samples in zip(PROMPTS, groups, strict=True)
        for s in samples
    )
    assert switched >= 12, "most requests were still running when the adapter changed"
    after = await engine.generate(PROMPTS[1], 4, max_tokens=24)
    assert all(s.versions == [old + 1] * len(s.versions) for s in after)
    served.assert_served(after, PROMPTS[1])


async def test_the_merged_export_computes_what_the_engine_served(
    colocated: tuple[GenerationEngine, Colocation], served: Served, tmp_path: Path
) -> None:
    engine, colocation = colocated
    served.new_adapter(seed=3, folder=tmp_path / "checkpoint")
    await hand_over(colocation, served.policy, engine.version + 1)
    samples = await engine.generate(PROMPTS[2], 4, max_tokens=24)
    assert main(["export", str(tmp_path / "checkpoint"), str(tmp_path / "merged"), "--merge"]) == 0
    exported = served.kit.load_hf(tmp_path / "merged")
    served.kit.assert_logprobs_match(exported, samples, PROMPTS[2], TEMPERATURE)
    # Greedy answers: the exported model's argmax is what the adapter-served logits pick.
    assert (tmp_path / "merged" / "model.safetensors").is_file()


async def test_a_broadcast_adapter_lands_in_a_separate_engine(
    kit: Any, served: Served, tmp_path: Path
) -> None:
    engine = GenerationEngine(engine_config(kit, served, "lora-async"), version=0)
    await engine.start()
    try:
        group = await kit.join_as_trainer(engine)
        try:
            served.new_adapter(seed=4, folder=tmp_path / "reference")
            named = list(served.policy.named_weights())
            sender = WeightSender(group, bucket_bytes=1 << 20)
            _, stats = await asyncio.gather(
                engine.update_weights(5, timeout_s=30.0),
                asyncio.to_thread(sender.send, named, 5),
            )
        finally:
            group.close()
        full = sum(
            p.numel() * p.element_size() for p in served.kit.load_hf(served.path).parameters()
        )
        print(f"\nadapter broadcast: {stats.bytes} bytes (the whole model: {full})")
        assert stats.bytes == sum(t.numel() * t.element_size() for _, t in named) < full / 4
        assert engine.version == 5
        samples = await engine.generate(PROMPTS[3], 4, max_tokens=24)
        assert all(s.versions == [5] * len(s.versions) for s in samples)
        served.assert_served(samples, PROMPTS[3])
    finally:
        await engine.shutdown()
