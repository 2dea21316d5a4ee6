"""The colocated mode's engine: vLLM in this process, new weights handed over in memory, and the
device shared with a trainer thread. The same checks as the separate engine's (test_engine.py):
log-probs equal Hugging Face's, version stamps, in-flight swaps continuing on the old KV cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from transformers import PreTrainedModel

from scalerl.demo.model import build_random_model
from scalerl.demo.tokenizer import build_tokenizer
from scalerl.generator.colocation import Colocation
from scalerl.generator.engine import GenerationEngine
from scalerl.recipe.interruption import InterruptionPlan

# slow: a real vLLM engine (and a Hugging Face reference model) per module.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

TOKENIZER = build_tokenizer()
PROMPTS = [
    [TOKENIZER.bos_token_id, *TOKENIZER.encode(text, add_special_tokens=False)]
    for text in ("What is 2+3?", "Name a prime.", "Spell cat.", "Count to 4.")
]
TEMPERATURE = 0.8


@dataclass
class Colocated:
    engine: GenerationEngine
    colocation: Colocation
    reference: PreTrainedModel  # an HF model holding the weights the engine holds now
    kit: Any

    async def hand_over(self, model: PreTrainedModel, version: int) -> float:
        """What the colocated trainer does, from its own thread: load its tensors in memory."""
        weights = list(model.state_dict().items())
        return await asyncio.to_thread(self.colocation.load, weights, version, 30.0)

    def assert_matches_reference(self, samples: list[Any], prompt: list[int]) -> None:
        self.kit.assert_logprobs_match(self.reference, samples, prompt, TEMPERATURE)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def colocated(kit: Any) -> AsyncIterator[Colocated]:
    path = kit.make_thinking_model(kit.root / "thinking-inproc")
    plan = InterruptionPlan(thinking_budget=16, answer_budget=12, window=(8, 16))
    config = kit.thinking_engine(path, kit.root / "inproc-run", TEMPERATURE, plan)
    colocation = Colocation()
    engine = GenerationEngine(config, version=0, colocation=colocation)
    await engine.start()
    yield Colocated(engine, colocation, kit.load_hf(path), kit)
    await engine.shutdown()


async def test_samples_equal_hf_and_carry_the_engine_version(colocated: Colocated) -> None:
    groups = await colocated.engine.evaluate(PROMPTS, 4)
    for prompt, samples in zip(PROMPTS, groups, strict=True):
        assert len(samples) == 4
        for s in samples:
            assert s.versions == [0] * len(s.completion_ids)
        colocated.assert_matches_reference(samples, prompt)


async def test_in_memory_update_continues_requests_on_new_weights(colocated: Colocated) -> None:
    engine, kit = colocated.engine, colocated.kit
    old_model, old = colocated.reference, engine.version
    new_model = kit.load_hf(build_random_model(kit.root / "inproc-seed-1", seed=1))
    running = [asyncio.ensure_future(engine.generate(p, 4, max_tokens=160)) for p in PROMPTS]
    while engine.pending_requests() < 16:
        await asyncio.sleep(0.001)
    await engine.generate(PROMPTS[0], 1, max_tokens=2)  # every request has sampled 2 tokens
    seconds = await colocated.hand_over(new_model, old + 1)
    groups = await asyncio.gather(*running)
    print(f"\nin-memory update (pause to resume): {seconds * 1000:.1f} ms")
    colocated.reference = new_model
    switched = sum(
        kit.check_swap(s, prompt, old_model, new_model, old, TEMPERATURE)
        for prompt, samples in zip(PROMPTS, groups, strict=True)
        for s in samples
    )
    assert switched >= 12, "most requests were still running when the weights changed"
    after = await engine.generate(PROMPTS[0], 4, max_tokens=24)
    assert all(s.versions == [old + 1] * len(s.versions) for s in after)
    colocated.assert_matches_reference(after, PROMPTS[0])


async def test_no_engine_step_runs_while_the_trainer_holds_the_device(
    colocated: Colocated,
) -> None:
    engine, turnstile = colocated.engine, colocated.colocation.turnstile
    steps: list[tuple[float, float]] = []  # (start, end) of every engine step
    inner = turnstile.engine
    assert inner is not None
    original = inner.step

    def timed_step() -> Any:
        started = time.monotonic()
        try:
            return original()
        finally:
            steps.append((started, time.monotonic()))

    held: list[tuple[float, float]] = []

    def trainer() -> None:
        for _ in range(3):
            with turnstile.hold():
                started = time.monotonic()
                time.sleep(0.05)  # a training step
                held.append((started, time.monotonic()))
            time.sleep(0.01)

    inner.step = timed_step  # type: ignore[method-assign]
    try:
        sampling = asyncio.ensure_future(engine.evaluate(PROMPTS, 8))
        while not steps:
            await asyncio.sleep(0.001)
        await asyncio.to_thread(trainer)
        groups = await sampling
    finally:
        inner.step = original  # type: ignore[method-assign]
    assert sum(len(g) for g in groups) == 32
    assert len(held) == 3 and len(steps) > 3
    overlaps = [(s, h) for s in steps for h in held if s[0] < h[1] and h[0] < s[1]]
    assert overlaps == [], "an engine step ran while the trainer held the device"
    # The engine went on between the holds: the trainer did not starve it, nor it the trainer.
    assert any(held[0][1] <= s[0] <= held[-1][0] for s in steps)
