"""Zero-variance groups and the effective batch (truncated samples leave it)."""

from __future__ import annotations

import pytest
import torch

from scalerl.errors import InputError
from scalerl.recipe import effective_sample_mask, zero_variance_groups


def loop_zero_variance(rewards: list[float], groups: list[int]) -> list[bool]:
    members: dict[int, set[float]] = {}
    for reward, group in zip(rewards, groups, strict=True):
        members.setdefault(group, set()).add(reward)
    return [len(members[group]) == 1 for group in groups]


def test_zero_variance_groups_match_loop_definition() -> None:
    gen = torch.Generator().manual_seed(0)
    groups = torch.randint(-5, 5, (40,), generator=gen)
    rewards = torch.where(torch.rand(40, generator=gen) > 0.3, 1.0, -1.0)
    expected = loop_zero_variance(rewards.tolist(), groups.tolist())
    assert zero_variance_groups(rewards, groups).tolist() == expected
    assert any(expected) and not all(expected)


def test_all_correct_all_wrong_and_single_sample_groups_are_zero_variance() -> None:
    rewards = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0])
    groups = torch.tensor([100, 100, 7, 7, 3, 3, 55])
    assert zero_variance_groups(rewards, groups).tolist() == [
        True,
        True,
        True,
        True,
        False,
        False,
        True,
    ]


def test_truncated_samples_leave_the_effective_batch() -> None:
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0])
    groups = torch.tensor([0, 0, 1, 1])
    truncated = torch.tensor([False, False, False, True])
    keep = effective_sample_mask(truncated, rewards, groups, drop_zero_variance=False)
    assert keep.tolist() == [True, True, True, False]


def test_zero_variance_is_judged_after_dropping_truncated_samples() -> None:
    # Group 1 has rewards {+1, -1}, but its -1 was truncated: what remains is all +1.
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0, -1.0])
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 2])
    truncated = torch.tensor([False, False, False, False, True, False, False])
    keep = effective_sample_mask(truncated, rewards, groups)
    assert keep.tolist() == [True, True, False, False, False, False, False]


def test_nothing_truncated_and_no_flat_group_keeps_everything() -> None:
    rewards = torch.tensor([1.0, -1.0, -1.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    keep = effective_sample_mask(torch.zeros(4, dtype=torch.bool), rewards, groups)
    assert keep.all()


def test_mismatched_shapes_raise_input_error() -> None:
    with pytest.raises(InputError, match=r"\[samples\]"):
        zero_variance_groups(torch.ones(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(InputError, match="truncated"):
        effective_sample_mask(torch.zeros(2, dtype=torch.bool), torch.ones(3), torch.zeros(3))
