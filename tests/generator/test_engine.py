"""The generation engine on the real vLLM (CPU): log-probs, version stamps, ScaleRL length rules
and in-flight weight updates over a real gloo sync group, checked against Hugging Face models.

One engine serves the whole module. It runs a random Llama that closes its thinking with ~5 %
probability per token, so within an 8-16 token window some samples close in time and the
others are interrupted. It samples at temperature 0.8, so every log-prob check also proves the
recorded log-probs are those of the tempered distribution. The harness tracks which HF model
holds the engine's current weights, so tests do not depend on their order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from transformers import PreTrainedModel

from scalerl.demo.model import build_random_model
from scalerl.demo.tokenizer import THINK_END, build_tokenizer
from scalerl.errors import DataError, InputError, WeightSyncError
from scalerl.generator.engine import DEFAULT_PHRASE, EngineConfig, GenerationEngine
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.rollout.records import Sample
from scalerl.sync import WeightSender

# slow: a real vLLM engine (and a Hugging Face reference model) per module.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

TOKENIZER = build_tokenizer()
EOS = TOKENIZER.eos_token_id
THINK = TOKENIZER.convert_tokens_to_ids(THINK_END)
PHRASE = TOKENIZER.encode(DEFAULT_PHRASE, add_special_tokens=False)
PLAN = InterruptionPlan(thinking_budget=16, answer_budget=12, window=(8, 16))
PROMPTS = [
    [TOKENIZER.bos_token_id, *TOKENIZER.encode(text, add_special_tokens=False)]
    for text in ("What is 2+3?", "Name a prime.", "Spell cat.", "Count to 4.")
]
PROMPT = PROMPTS[0]
FIRST_VERSION = 3
TEMPERATURE = 0.8


@dataclass
class Harness:
    engine: GenerationEngine
    reference: PreTrainedModel  # an HF model holding the weights the engine holds now
    kit: Any  # conftest.Kit

    def assert_matches_reference(self, samples: list[Sample], prompt: list[int]) -> None:
        self.kit.assert_logprobs_match(self.reference, samples, prompt, TEMPERATURE)


async def _started(kit: Any, separate_process: bool | None) -> Harness:
    path = kit.make_thinking_model(kit.root / "thinking")
    run = kit.root / f"engine-run-{separate_process}"
    config = kit.thinking_engine(path, run, TEMPERATURE, PLAN)
    config = dataclasses.replace(config, separate_process=separate_process)
    engine = GenerationEngine(config, version=FIRST_VERSION)
    seconds = await engine.start()
    print(f"\nengine start ({separate_process=}): {seconds:.1f} s")
    await engine.generate(PROMPT, 2, max_tokens=4)  # first-request warm-up
    return Harness(engine, kit.load_hf(path), kit)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harness(kit: Any) -> AsyncIterator[Harness]:
    """The engine as a generator on this CPU runs it: in this process."""
    started = await _started(kit, None)
    assert not started.engine._separate_process()
    yield started
    await started.engine.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def separate_harness(kit: Any) -> AsyncIterator[Harness]:
    """The engine as a generator on an accelerator runs it: its core in a process of its own."""
    started = await _started(kit, True)
    yield started
    await started.engine.shutdown()


@pytest.fixture(params=["harness", "separate_harness"])
def receiver(request: pytest.FixtureRequest) -> Harness:
    """Both ways of running the engine, for what differs between them: weight updates."""
    found: Harness = request.getfixturevalue(request.param)
    return found


async def test_samples_carry_vllm_logprobs_equal_to_hf_and_the_engine_version(
    harness: Harness,
) -> None:
    engine = harness.engine
    samples = await engine.generate(PROMPT, 6, max_tokens=24)
    assert len(samples) == 6
    assert len({tuple(s.completion_ids) for s in samples}) > 1
    for s in samples:
        assert 1 <= len(s.completion_ids) <= 24
        assert len(s.logprobs) == len(s.versions) == len(s.loss_mask) == len(s.completion_ids)
        assert s.versions == [engine.version] * len(s.completion_ids)
        assert s.loss_mask == [1] * len(s.completion_ids)
        assert s.reward == 0.0 and not s.interrupted
        assert s.truncated == (s.completion_ids[-1] != EOS) == (s.finish_reason == "length")
    harness.assert_matches_reference(samples, PROMPT)


async def test_thinking_is_cut_in_the_window_and_the_answer_keeps_its_budget(
    harness: Harness,
) -> None:
    samples = await harness.engine.generate(PROMPT, 48)
    kinds = [_check_length_rules(s) for s in samples]
    cuts = {s.loss_mask.index(0) for s in samples if s.interrupted}
    print(f"\nthinking ended: { {k: kinds.count(k) for k in set(kinds)} }, cuts at {sorted(cuts)}")
    assert kinds.count("interrupted") >= 8 and kinds.count("closed") >= 8, kinds
    assert len(cuts) > 1, "cutoffs are drawn from the window, not fixed"
    for s in samples:
        assert set(s.versions) == {harness.engine.version}
    harness.assert_matches_reference(samples, PROMPT)


def _check_length_rules(s: Sample) -> str:
    """Which way the thinking ended; asserts the rules that way implies."""
    ids, budget = s.completion_ids, PLAN.answer_budget
    assert len(s.logprobs) == len(s.versions) == len(s.loss_mask) == len(ids)
    if s.interrupted:
        cut = s.loss_mask.index(0)
        answer = ids[cut + len(PHRASE) :]
        assert PLAN.window[0] <= cut <= PLAN.window[1]
        assert ids[cut : cut + len(PHRASE)] == PHRASE
        assert s.loss_mask == [1] * cut + [0] * len(PHRASE) + [1] * len(answer)
        assert s.logprobs[cut : cut + len(PHRASE)] == [0.0] * len(PHRASE)
        assert THINK not in ids[:cut] and EOS not in ids[:cut]
        kind = "interrupted"
    elif THINK in ids:
        closed = ids.index(THINK) + 1
        answer = ids[closed:]
        assert closed <= PLAN.window[1] and EOS not in ids[:closed]
        assert s.loss_mask == [1] * len(ids)
        kind = "closed"
    else:  # EOS before the thinking closed or was cut: a complete (if odd) sample
        assert ids[-1] == EOS and len(ids) <= PLAN.window[1] and not s.truncated
        return "eos"
    assert 1 <= len(answer) <= budget
    assert s.truncated == (answer[-1] != EOS) == (s.finish_reason == "length")
    assert s.truncated == (len(answer) == budget and answer[-1] != EOS)
    return kind


async def test_evaluate_returns_one_group_per_prompt(harness: Harness) -> None:
    started = time.monotonic()
    groups = await harness.engine.evaluate(PROMPTS * 4, 8)
    seconds = time.monotonic() - started
    tokens = sum(len(s.completion_ids) for g in groups for s in g)
    print(f"\nevaluate: 16 prompts x 8 samples, {tokens} tokens in {seconds:.2f} s")
    assert [len(g) for g in groups] == [8] * 16
    assert all(_check_length_rules(s) for g in groups for s in g)


def _tokens(groups: list[list[Sample]]) -> list[list[list[int]]]:
    return [[s.completion_ids for s in g] for g in groups]


async def test_a_seeded_evaluation_samples_alike_whatever_else_the_engine_does(
    harness: Harness,
) -> None:
    # The held-out evaluation n of a run samples alike whether or not the run restarted before
    # it: its samples depend on the seed, the prompts and the weights, not on what the engine
    # sampled before or on which other requests share its batches.
    engine = harness.engine
    # 48 copies of a ~130-token prompt: more prefill than one engine step computes (4096 tokens).
    long = PROMPTS[1] + TOKENIZER.encode(" and then" * 40, add_special_tokens=False)
    prompts = [*PROMPTS, *[long] * 48]
    seeds = [f"7/eval/3/p{i}" for i in range(len(prompts))]
    alone = await engine.evaluate(prompts, 4, seeds)
    unseeded_traffic = asyncio.gather(*(engine.generate(p, 8) for p in PROMPTS * 8))
    crowded = await engine.evaluate(prompts, 4, seeds)
    await unseeded_traffic
    assert _tokens(crowded) == _tokens(alone)
    # ... and the seed is what fixes them: another evaluation's seeds sample otherwise.
    later = await engine.evaluate(prompts, 4, [f"7/eval/4/p{i}" for i in range(len(prompts))])
    assert _tokens(later) != _tokens(alone)
    assert all(_check_length_rules(s) for g in alone for s in g)
    harness.assert_matches_reference(alone[0], prompts[0])


async def test_a_missing_model_directory_is_a_data_error(tmp_path: Path) -> None:
    config = EngineConfig(
        model_path=str(tmp_path / "nothing-here"),
        dtype="float32",
        fp32_lm_head=False,
        max_model_len=64,
        temperature=1.0,
        seed=0,
        phrase=DEFAULT_PHRASE,
        plan=PLAN,
    )
    with pytest.raises(DataError, match="not a Hugging Face model directory"):
        await GenerationEngine(config).start()


async def test_a_prompt_longer_than_the_model_length_is_an_input_error(harness: Harness) -> None:
    with pytest.raises(InputError, match="max_model_len 512"):
        await harness.engine.generate([5] * 600, 1)


async def test_in_flight_update_continues_requests_on_new_weights(receiver: Harness) -> None:
    engine, kit = receiver.engine, receiver.kit
    old_model, old = receiver.reference, engine.version
    new_model = kit.load_hf(build_random_model(kit.root / "policy-seed-1", seed=1))
    group = await kit.join_as_trainer(engine)
    try:
        running = [asyncio.ensure_future(engine.generate(p, 4, max_tokens=160)) for p in PROMPTS]
        while engine.pending_requests() < 16:
            await asyncio.sleep(0.001)
        # The scheduler serves requests in arrival order, so once a later request has produced
        # 2 tokens every earlier one has too.
        await engine.generate(PROMPT, 1, max_tokens=2)
        seconds = await kit.push_weights(engine, group, new_model, old + 1)
        groups = await asyncio.gather(*running)
    finally:
        group.close()
    print(f"\nupdate_weights (pause to resume): {seconds:.2f} s")
    assert engine.version == old + 1
    receiver.reference = new_model
    switched = 0
    for prompt, samples in zip(PROMPTS, groups, strict=True):
        for s in samples:
            switched += kit.check_swap(s, prompt, old_model, new_model, old, TEMPERATURE)
    print(f"{switched} of 16 requests saw the swap")
    assert switched >= 12, "most requests were still running when the weights changed"
    after = await engine.generate(PROMPT, 4, max_tokens=24)
    assert all(s.versions == [old + 1] * len(s.versions) for s in after)
    receiver.assert_matches_reference(after, PROMPT)


async def test_requests_after_an_update_do_not_reuse_kv_cached_by_old_weights(
    receiver: Harness,
) -> None:
    engine, kit = receiver.engine, receiver.kit
    # Two full KV blocks (128 tokens on CPU) that the prefix cache keeps after the first call.
    long_prompt = [TOKENIZER.bos_token_id, *([*range(4, 99)] * 3)[:299]]
    receiver.assert_matches_reference(
        await engine.generate(long_prompt, 2, max_tokens=8), long_prompt
    )
    new_model = kit.load_hf(build_random_model(kit.root / "policy-seed-3", seed=3))
    group = await kit.join_as_trainer(engine)
    try:
        await kit.push_weights(engine, group, new_model, engine.version + 1)
    finally:
        group.close()
    receiver.reference = new_model
    receiver.assert_matches_reference(
        await engine.generate(long_prompt, 2, max_tokens=8), long_prompt
    )


class DamagingSender(WeightSender):
    """A sender whose first bucket arrives with one byte flipped."""

    def _broadcast_bucket(self, index: int, data: torch.Tensor) -> None:
        if index == 0:
            data = data.clone()
            data[0] ^= 0xFF
        self.group.broadcast(data)


async def test_failed_updates_keep_the_old_weights_and_version(receiver: Harness) -> None:
    engine, kit = receiver.engine, receiver.kit
    before = engine.version
    other = kit.load_hf(build_random_model(kit.root / "policy-seed-2", seed=2))
    group = await kit.join_as_trainer(engine)
    try:
        damaged = asyncio.to_thread(
            DamagingSender(group).send, other.state_dict().items(), before + 1
        )
        update = engine.update_weights(before + 1, timeout_s=30.0)
        error, _ = await asyncio.gather(update, damaged, return_exceptions=True)
        assert isinstance(error, WeightSyncError) and "checksum mismatch" in str(error), error
        # The trainer never sends: the receive times out.
        with pytest.raises(WeightSyncError, match=f"continues on version {before}"):
            await engine.update_weights(before + 1, timeout_s=2.0)
    finally:
        group.close()
    assert engine.version == before
    samples = await engine.generate(PROMPT, 4, max_tokens=24)
    assert all(s.versions == [before] * len(s.versions) for s in samples)
    receiver.assert_matches_reference(samples, PROMPT)
    # A timed-out group is broken; rejoining it makes updates work again.
    group = await kit.join_as_trainer(engine)
    try:
        await kit.push_weights(engine, group, other, before + 1)
    finally:
        group.close()
    receiver.reference = other
    assert engine.version == before + 1
    receiver.assert_matches_reference(await engine.generate(PROMPT, 4, max_tokens=24), PROMPT)
