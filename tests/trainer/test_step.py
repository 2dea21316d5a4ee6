"""train_step: it learns, the NaN guard changes nothing, micro-batches equal full steps; optim."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from scalerl.rollout.records import RolloutGroup
from scalerl.trainer import (
    Batch,
    Policy,
    StepSettings,
    build_batch,
    build_optimizer,
    load_policy,
    train_step,
)
from scalerl.trainer.shard import checkpoint_layers
from scalerl.trainer.step import _pack_groups, plan_micro_batches

Factory = Callable[..., RolloutGroup]
CLIPS = {"epsilon_max": 4.0, "epsilon_low": 0.2, "epsilon_high": 0.28}
CISPO = StepSettings("cispo", "prompt", **CLIPS)


def mixed_batch(make_group: Factory, policy: Policy, groups: int = 4, size: int = 4) -> Batch:
    """Groups of varied lengths and rewards, with old log-probs from the policy itself."""
    made = []
    for g in range(groups):
        rewards = [1.0 if (g + i) % 3 == 0 else -1.0 for i in range(size)]
        lengths = [3 + (g * 5 + i * 3) % 9 for i in range(size)]
        made.append(make_group(rewards, lengths=lengths, prompt_length=2 + g, seed=g + 1))
    batch, _ = build_batch(made, current_version=0, max_off_policy=None, pad_id=policy.pad_id)
    assert batch is not None
    with torch.no_grad():
        logprobs, _ = policy.completion_logprobs(batch)
    return replace(batch, old_logprobs=logprobs)


def test_the_reported_entropy_is_the_batchs_mean_token_entropy(
    model_dir: Path, make_group: Factory
) -> None:
    """DESIGN's `entropy`: the mean token entropy (nats) over the trained tokens of the batch,
    computed here from a separately loaded Hugging Face model, before the update."""
    from transformers import AutoModelForCausalLM

    policy = load_policy(model_dir, fp32_lm_head=True)
    batch = mixed_batch(make_group, policy)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    values = []
    for s, t in batch.loss_mask.nonzero().tolist():
        row = logits[s, int(batch.completion_positions[s, t]) - 1].double()
        p = row.softmax(-1)
        values.append(float(-(p * p.log()).sum()))
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-15, warmup_steps=0
    )
    result = train_step(policy, optimizer, scheduler, batch, CISPO)
    assert result.entropy == pytest.approx(sum(values) / len(values), rel=1e-5)


def snapshot(policy: Policy) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in policy.model.named_parameters()}


def test_step_raises_logprobs_of_positive_advantage_samples(
    model_dir: Path, make_group: Factory
) -> None:
    policy = load_policy(model_dir, fp32_lm_head=True)
    batch = mixed_batch(make_group, policy)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-15, warmup_steps=0
    )
    result = train_step(policy, optimizer, scheduler, batch, CISPO)
    assert not result.skipped and math.isfinite(result.loss) and result.grad_norm > 0
    assert result.tokens == batch.tokens and result.samples == batch.samples
    assert result.entropy > 0 and result.lr == pytest.approx(1e-4)
    assert result.stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy
    with torch.no_grad():
        after, _ = policy.completion_logprobs(batch)
    change = torch.where(batch.loss_mask, after - batch.old_logprobs, 0.0).sum(dim=-1)
    assert bool((change[batch.advantages > 0] > 0).all())
    assert bool((change[batch.advantages < 0] < 0).all())


@pytest.mark.parametrize("poison", ["old_logprobs", "advantages"])
def test_nan_guard_skips_and_changes_nothing(
    model_dir: Path, make_group: Factory, poison: str
) -> None:
    policy = load_policy(model_dir, fp32_lm_head=True)
    batch = mixed_batch(make_group, policy)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-15, warmup_steps=10
    )
    train_step(policy, optimizer, scheduler, batch, CISPO)
    params, state = snapshot(policy), copy.deepcopy(optimizer.state_dict())
    schedule = scheduler.state_dict()
    poisoned = getattr(batch, poison).clone()
    poisoned.view(-1)[0] = math.nan
    result = train_step(policy, optimizer, scheduler, replace(batch, **{poison: poisoned}), CISPO)
    assert result.skipped and "non-finite" in result.reason
    assert all(torch.equal(p, params[name]) for name, p in policy.model.named_parameters())
    assert all(p.grad is None for p in policy.parameters())
    after = optimizer.state_dict()
    for key, values in state["state"].items():
        for name, value in values.items():
            assert torch.equal(after["state"][key][name], value)
    assert scheduler.state_dict() == schedule


def test_nan_gradient_norm_is_skipped(model_dir: Path, make_group: Factory) -> None:
    policy = load_policy(model_dir, fp32_lm_head=False)
    batch = mixed_batch(make_group, policy)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-4, weight_decay=0.0, eps=1e-15, warmup_steps=0
    )
    params = snapshot(policy)
    hook = policy.head.weight.register_hook(lambda grad: grad * math.inf)
    token = replace(CISPO, aggregation="token")
    result = train_step(policy, optimizer, scheduler, batch, token)
    hook.remove()
    assert result.skipped and "gradient norm" in result.reason
    assert all(torch.equal(p, params[name]) for name, p in policy.model.named_parameters())
    assert scheduler.last_epoch == 0


def sgd_step(
    model_dir: Path,
    batch: Batch,
    micro: int | None,
    loss: str,
    aggregation: str,
    **memory: Any,
) -> tuple[Policy, float]:
    """One plain-SGD step (lr 1): the parameter change is exactly the gradient. ``memory``:
    token budgets, packing, activation checkpointing."""
    policy = load_policy(model_dir, fp32_lm_head=True)
    if memory.pop("checkpointing", False):
        checkpoint_layers(policy)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    scheduler = LambdaLR(optimizer, lambda _: 1.0)
    clips = {**CLIPS, "epsilon_low": 0.003, "epsilon_high": 0.004} if loss == "gspo" else CLIPS
    settings = StepSettings(loss, aggregation, **clips, micro_batch_samples=micro, **memory)
    result = train_step(policy, optimizer, scheduler, batch, settings)
    return policy, result.loss


@pytest.mark.parametrize(
    ("loss", "aggregation", "micro"),
    [
        ("cispo", "prompt", 8),  # whole groups
        ("cispo", "prompt", 3),  # groups of 4 split into pieces
        ("cispo", "sample", 3),
        ("cispo", "token", 5),
        ("dapo", "prompt", 3),
        ("gspo", "sample", 2),
    ],
)
def test_micro_batched_step_equals_full_step(
    model_dir: Path, make_group: Factory, loss: str, aggregation: str, micro: int
) -> None:
    reference = load_policy(model_dir, fp32_lm_head=True)
    batch = mixed_batch(make_group, reference)
    # Off-policy ratios, so clipping and caps take part.
    batch = replace(
        batch, old_logprobs=batch.old_logprobs + 0.3 * torch.randn_like(batch.old_logprobs)
    )
    full, full_loss = sgd_step(model_dir, batch, None, loss, aggregation)
    split, split_loss = sgd_step(model_dir, batch, micro, loss, aggregation)
    assert split_loss == pytest.approx(full_loss, abs=1e-6)
    for (name, a), b in zip(full.model.named_parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize(
    ("aggregation", "memory"),
    [
        ("prompt", {"micro_batch_tokens": 60, "packed": True}),  # groups, and pieces of groups
        ("token", {"micro_batch_tokens": 25, "packed": True}),  # some samples alone
        ("sample", {"micro_batch_tokens": 40, "packed": True, "checkpointing": True}),
    ],
)
def test_token_budgets_packing_and_checkpointing_give_the_full_step(
    model_dir: Path, make_group: Factory, aggregation: str, memory: dict[str, Any]
) -> None:
    reference = load_policy(model_dir, fp32_lm_head=True)
    batch = mixed_batch(make_group, reference)
    batch = replace(
        batch, old_logprobs=batch.old_logprobs + 0.3 * torch.randn_like(batch.old_logprobs)
    )
    parts = plan_micro_batches(batch, None, aggregation, memory.get("micro_batch_tokens"))
    assert len(parts) > 2  # the budget really splits the batch
    full, full_loss = sgd_step(model_dir, batch, None, "cispo", aggregation)
    split, split_loss = sgd_step(model_dir, batch, None, "cispo", aggregation, **memory)
    assert split_loss == pytest.approx(full_loss, abs=1e-6)
    for (name, a), b in zip(full.model.named_parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)


def test_token_budgets_hold_whole_groups_up_to_the_budget() -> None:
    # Groups of 2, 2, 6 and 2 samples of 10 tokens: the third group (60 tokens) exceeds the
    # budget and goes alone, in pieces; the others share a micro-batch where they fit.
    sizes, weights = [2, 2, 6, 2], [10] * 12
    assert _pack_groups(sizes, 45, weights) == [(0, 4), (4, 8), (8, 10), (10, 12)]
    assert _pack_groups(sizes, 35, weights) == [(0, 2), (2, 4), (4, 7), (7, 10), (10, 12)]
    assert _pack_groups([1, 1], 5, [9, 3]) == [(0, 1), (1, 2)]  # a sample over budget: alone


def test_prompt_micro_batches_hold_whole_groups_or_one_group_piece(
    model_dir: Path, make_group: Factory
) -> None:
    policy = load_policy(model_dir, fp32_lm_head=False)
    made = [make_group([1.0, -1.0] * (n // 2), seed=i) for i, n in enumerate([2, 2, 6, 2, 4])]
    batch, _ = build_batch(made, current_version=0, max_off_policy=None, pad_id=policy.pad_id)
    assert batch is not None
    parts = plan_micro_batches(batch, 4, "prompt")
    assert [p.tolist() for p in parts] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9],
        [10, 11],
        [12, 13, 14, 15],
    ]
    assert all(len(p) <= 4 for p in plan_micro_batches(batch, 3, "token"))


def test_grad_clipping_bounds_the_update(model_dir: Path, make_group: Factory) -> None:
    policy = load_policy(model_dir, fp32_lm_head=False)
    batch = mixed_batch(make_group, policy)
    before = snapshot(policy)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    clipped = replace(CISPO, max_grad_norm=1e-3)
    result = train_step(policy, optimizer, LambdaLR(optimizer, lambda _: 1.0), batch, clipped)
    assert result.grad_norm > 1e-3  # reported before clipping
    moved = torch.cat(
        [(p.detach() - before[n]).flatten() for n, p in policy.model.named_parameters()]
    )
    assert float(moved.norm()) == pytest.approx(1e-3, rel=1e-3)


def test_warmup_ramps_linearly_then_stays_constant() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer, scheduler = build_optimizer(
        [param], lr=5e-7, weight_decay=0.01, eps=1e-15, warmup_steps=4
    )
    assert optimizer.defaults["eps"] == 1e-15 and optimizer.defaults["weight_decay"] == 0.01
    seen = []
    for _ in range(6):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([5e-7 * f for f in (0.25, 0.5, 0.75, 1.0, 1.0, 1.0)])


def test_no_warmup_starts_at_full_rate() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer, _ = build_optimizer([param], lr=1e-3, weight_decay=0.0, eps=1e-8, warmup_steps=0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_batch_without_trained_tokens_is_skipped(model_dir: Path, make_group: Factory) -> None:
    policy = load_policy(model_dir, fp32_lm_head=False)
    batch = mixed_batch(make_group, policy)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-3, weight_decay=0.1, eps=1e-15, warmup_steps=0
    )
    params = snapshot(policy)
    empty = replace(batch, loss_mask=torch.zeros_like(batch.loss_mask))
    result = train_step(policy, optimizer, scheduler, empty, CISPO)
    assert result.skipped and "no trained tokens" in result.reason
    assert all(torch.equal(p, params[name]) for name, p in policy.model.named_parameters())


def test_a_step_reports_mismatch_per_policy_lag_as_an_independent_forward_reads_it(
    model_dir: Path, make_group: Factory
) -> None:
    """The trainer holds version 5. Group 0 was sampled by version 5 with the trainer's very
    log-probs (lag 0: no mismatch in float32), groups 1 and 2 by versions 4 and 3, recorded 0.05
    and 0.3 nats apart from the trainer's. Each lag's figures are recomputed here from a
    separately loaded Hugging Face model and the rollout records, in micro-batches of two
    samples (so the figures are summed across them)."""
    from transformers import AutoModelForCausalLM

    policy = load_policy(model_dir, fp32_lm_head=True)
    groups = [
        make_group([1.0, -1.0, 1.0], version=5 - lag, lengths=[4, 6, 5], seed=10 + lag)
        for lag in range(3)
    ]
    batch, _ = build_batch(groups, current_version=5, max_off_policy=None, pad_id=policy.pad_id)
    assert batch is not None
    with torch.no_grad():
        own, _ = policy.completion_logprobs(batch)
    shift = torch.tensor([0.0, 0.05, -0.3])[batch.group_index, None]
    noise = torch.randn(own.shape, generator=torch.Generator().manual_seed(0))
    recorded = torch.where(batch.group_index[:, None] == 0, own, own + shift * (1 + noise))
    batch = replace(batch, old_logprobs=recorded)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-15, warmup_steps=0
    )
    settings = replace(CISPO, micro_batch_samples=2)

    result = train_step(policy, optimizer, scheduler, batch, settings)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    gaps: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for s, t in batch.loss_mask.nonzero().tolist():
        row = logits[s, int(batch.completion_positions[s, t]) - 1].double().log_softmax(-1)
        token = int(batch.input_ids[s, int(batch.completion_positions[s, t])])
        lag = 5 - groups[int(batch.group_index[s])].samples[0].versions[0]
        gaps[lag].append(float(row[token]) - float(recorded[s, t]))

    assert sorted(result.mismatch) == [0, 1, 2]
    assert result.mismatch[0].kl < 1e-10 and result.mismatch[0].abs_max < 1e-5
    for lag in (1, 2):
        d = torch.tensor(gaps[lag], dtype=torch.float64)
        got = result.mismatch[lag]
        assert got.tokens == len(d)
        assert got.kl == pytest.approx(float((d.exp() - 1 - d).mean()), rel=1e-4)
        assert got.abs_mean == pytest.approx(float(d.abs().mean()), rel=1e-4)
        assert got.abs_max == pytest.approx(float(d.abs().max()), rel=1e-4)
        assert got.outside == float(((d.exp() < 0.8) | (d.exp() > 1.25)).double().mean())
    assert result.mismatch[1].kl < result.mismatch[2].kl
