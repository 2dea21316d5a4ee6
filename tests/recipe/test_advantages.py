"""Group-relative advantages against loop-based means and (population) stds."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.errors import InputError
from scalerl.recipe import compute_advantages

GROUPS = [11, 11, 11, 11, 4, 4, 4, -2, 90, 90]  # arbitrary ids; -2 is a one-sample group


def loop_advantages(rewards: list[float], groups: list[int], mode: str, eps: float) -> list[float]:
    members: dict[int, list[float]] = {}
    for reward, group in zip(rewards, groups, strict=True):
        members.setdefault(group, []).append(reward)
    means = {g: sum(v) / len(v) for g, v in members.items()}
    stds = {g: math.sqrt(sum((x - means[g]) ** 2 for x in v) / len(v)) for g, v in members.items()}
    centred = [r - means[g] for r, g in zip(rewards, groups, strict=True)]
    if mode == "prompt":
        return [a / (stds[g] + eps) for a, g in zip(centred, groups, strict=True)]
    if mode == "batch":
        mean = sum(centred) / len(centred)
        std = math.sqrt(sum((a - mean) ** 2 for a in centred) / len(centred))
        return [a / (std + eps) for a in centred]
    return centred


@pytest.mark.parametrize("mode", ["batch", "prompt", "none"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_advantages_match_paper_formula(mode: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(len(GROUPS), generator=gen, dtype=torch.float64)
    result = compute_advantages(rewards, torch.tensor(GROUPS), mode, eps=1e-6)
    expected = loop_advantages(rewards.tolist(), GROUPS, mode, 1e-6)
    torch.testing.assert_close(result, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("mode", ["batch", "prompt", "none"])
def test_plus_minus_one_rewards_match_paper_formula(mode: str) -> None:
    rewards = [1.0, -1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0]
    result = compute_advantages(torch.tensor(rewards), torch.tensor(GROUPS), mode)
    expected = loop_advantages(rewards, GROUPS, mode, 1e-6)
    torch.testing.assert_close(result, torch.tensor(expected), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["batch", "prompt", "none"])
def test_one_sample_group_gets_zero_advantage(mode: str) -> None:
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0])
    result = compute_advantages(rewards, torch.tensor([0, 0, 7, 3]), mode)
    assert torch.isfinite(result).all()
    assert result[2:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("mode", ["batch", "prompt", "none"])
def test_all_zero_variance_batch_gives_exact_zeros(mode: str) -> None:
    # 0.1 three times does not average back to exactly 0.1 in floating point.
    rewards = torch.tensor([0.1, 0.1, 0.1, -1.0, -1.0, 0.7], dtype=torch.float64)
    result = compute_advantages(rewards, torch.tensor([5, 5, 5, 6, 6, 9]), mode)
    assert result.tolist() == [0.0] * 6


def test_group_ids_are_labels_only() -> None:
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0])
    dense = compute_advantages(rewards, torch.tensor([0, 0, 1, 1, 1, 2, 2]), "prompt")
    sparse = compute_advantages(
        rewards, torch.tensor([-50, -50, 10**9, 10**9, 10**9, 3, 3]), "prompt"
    )
    torch.testing.assert_close(dense, sparse)


@pytest.mark.parametrize("mode", ["batch", "prompt", "none"])
def test_shuffling_samples_shuffles_advantages(mode: str) -> None:
    gen = torch.Generator().manual_seed(3)
    rewards = torch.randn(len(GROUPS), generator=gen)
    groups = torch.tensor(GROUPS)
    order = torch.randperm(len(GROUPS), generator=gen)
    expected = compute_advantages(rewards, groups, mode)[order]
    torch.testing.assert_close(compute_advantages(rewards[order], groups[order], mode), expected)


def test_integer_rewards_and_empty_batch_are_accepted() -> None:
    result = compute_advantages(torch.tensor([1, -1]), torch.tensor([0, 0]), "none")
    assert result.tolist() == [1.0, -1.0]
    assert compute_advantages(torch.empty(0), torch.empty(0, dtype=torch.long)).numel() == 0


def test_advantages_are_constants() -> None:
    rewards = torch.tensor([1.0, -1.0], requires_grad=True)
    assert not compute_advantages(rewards, torch.tensor([0, 0])).requires_grad


def test_bad_inputs_raise_input_error() -> None:
    rewards = torch.tensor([1.0, -1.0])
    with pytest.raises(InputError, match="unknown advantage normalization 'group'"):
        compute_advantages(rewards, torch.tensor([0, 0]), "group")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"\[samples\]"):
        compute_advantages(rewards, torch.tensor([0, 0, 0]))
    with pytest.raises(InputError, match="integer"):
        compute_advantages(rewards, torch.tensor([0.0, 0.0]))
