"""A multi-turn sample from the real engine is what the trainer trains on: the per-token log-probs
vLLM recorded across turns equal those the trainer's policy computes over the same sequences,
and the environment's messages in between are kept but never trained.

slow: a real vLLM engine (CPU, its core in a process of its own) on a random Llama whose
turn-ending token is likely (~1 in 6 per token), so every rollout takes several turns within its
budget.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
import verifiers as vf
from chat_models import KEEPS_PREFIX, chat_tokenizer, end_id
from datasets import Dataset
from transformers import AutoModelForCausalLM

from scalerl.agents.client import EngineClient
from scalerl.agents.containment import contain
from scalerl.agents.load import environment_examples
from scalerl.agents.rollouts import AgentRollouts
from scalerl.demo.model import build_random_model
from scalerl.generator.engine import EngineConfig, GenerationEngine
from scalerl.generator.tokens import ModelTokens
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.rollout.records import RolloutGroup
from scalerl.spec import EnvironmentSpec, parse_run
from scalerl.trainer import build_batch, load_policy

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
TEMPERATURE = 0.8
VERSION = 7
END_ODDS = 30.0  # against an average token: P(end) ~ 30 / (30 + vocabulary)


def turn_ending_model(path: Path) -> Path:
    """A random Llama with the chat tokenizer whose `<|end|>` logit is raised everywhere (hidden
    dimension 0 pinned positive, as tests/generator's thinking model does for `</think>`)."""
    tokenizer = chat_tokenizer(KEEPS_PREFIX)
    end = end_id(tokenizer)
    build_random_model(path, tokenizer=tokenizer, eos_ids=[end])
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 0.1
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
        pinned = model.model(torch.arange(4, 90).reshape(2, -1)).last_hidden_state[..., 0].mean()
        model.lm_head.weight[end].zero_()
        model.lm_head.weight[end, 0] = math.log(END_ODDS) / pinned
    model.save_pretrained(str(path), safe_serialization=True)
    return path


class Again(vf.MultiTurnEnv):  # type: ignore[misc]
    """Answers every model turn with "again" until its turns run out."""

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> Any:
        return [{"role": "user", "content": "again"}]


def again_env() -> Any:
    data = Dataset.from_list(
        [{"question": "Count.", "answer": "3"}, {"question": "Go.", "answer": "1"}]
    )
    return Again(
        dataset=data,
        eval_dataset=data,
        max_turns=3,
        rubric=vf.Rubric(funcs=[lambda state: len(state["trajectory"]) / 3]),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GenerationEngine]:
    root = tmp_path_factory.mktemp("agreement")
    path = turn_ending_model(root / "model")
    config = EngineConfig(
        model_path=str(path),
        dtype="float32",
        fp32_lm_head=False,
        max_model_len=512,
        temperature=TEMPERATURE,
        seed=0,
        phrase="",
        think_end=None,
        plan=InterruptionPlan(thinking_budget=8, answer_budget=48, window=(4, 8), enabled=False),
        run_dir=str(root / "run"),
        # Its core in a process of its own: an engine in this process would change it for the
        # tests after this one (vLLM sets torch's threads to 1 and extends its worker class).
        separate_process=True,
    )
    started = GenerationEngine(config, version=VERSION)
    await started.start()
    yield started
    await started.shutdown()


async def test_the_trainer_computes_the_log_probs_the_engine_sampled_across_turns(
    engine: GenerationEngine,
) -> None:
    env = again_env()
    environment = EnvironmentSpec.model_validate({"verifiers": {"id": "inline"}})
    contain(env, environment)
    tokenizer = chat_tokenizer(KEEPS_PREFIX)
    tokens = ModelTokens(tokenizer, frozenset({end_id(tokenizer)}), None)

    config = engine.config
    client = EngineClient(engine.turn, tokens, config.max_model_len, config.plan)
    agents = AgentRollouts(env, client, environment)
    spec = parse_run(
        {
            "apiVersion": "scalerl.dev/v1alpha1",
            "kind": "ScaleRLRun",
            "metadata": {"name": "agree"},
            "spec": {"model": {"path": "/m"}, "environment": {"verifiers": {"id": "inline"}}},
        }
    ).spec
    train, _ = environment_examples(env, spec)
    samples = await agents.sample(train[0], 6)
    turns = [s.conversation.turns for s in samples if s.conversation]
    breaks = [len(s.conversation.breaks) for s in samples if s.conversation]
    print(f"\nturns per rollout: {turns}, template breaks: {breaks}")
    assert len(samples) == 6 and max(turns) >= 2
    prompt = agents.prompt_ids(train[0])
    # Independently of how the sample was assembled: between two model turns lies exactly what
    # the chat template writes after a turn and for the environment's "again".
    text = tokenizer.apply_chat_template(
        [{"role": "assistant", "content": "X"}, {"role": "user", "content": "again"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    between = text.split("X<|end|>", 1)[1]
    for s in samples:
        assert s.conversation is not None and set(s.versions) == {VERSION}
        # Per sequence: a model turn that re-tokenizes otherwise (random bytes) starts another.
        spans = [
            (m, [t for t, _ in run])
            for _, piece in s.pieces(prompt)
            for m, run in itertools.groupby(
                zip(s.completion_ids[piece], s.loss_mask[piece], strict=True), lambda p: p[1]
            )
        ]
        model_spans = [ids for m, ids in spans if m]
        assert len(model_spans) == s.conversation.turns
        assert all(ids[-1] == end_id(tokenizer) for ids in model_spans[:-1])
        environment = [tokenizer.decode(ids) for m, ids in spans if not m]
        assert environment == [between] * (s.conversation.turns - 1 - len(s.conversation.breaks))
        assert s.generated_tokens == sum(s.loss_mask) <= 48
    group = RolloutGroup(train[0].id, prompt, samples, generator=0)
    batch, _ = build_batch(
        [group], current_version=VERSION, max_off_policy=None, pad_id=0, drop_zero_variance=False
    )
    assert batch is not None
    policy = load_policy(
        Path(engine.config.model_path), fp32_lm_head=False, temperature=TEMPERATURE
    )
    logprobs, _ = policy.completion_logprobs(batch)
    mask = batch.loss_mask
    assert int(mask.sum()) == sum(s.generated_tokens for s in samples)
    torch.testing.assert_close(logprobs[mask], batch.old_logprobs[mask], atol=1e-4, rtol=0)
