"""Loss aggregation modes against loop-based sums, and their empty-selection edge cases."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from scalerl.errors import InputError
from scalerl.recipe import aggregate, masked_mean

GROUPS = [3, 3, 3, 8, 8, -1, 20, 20]  # arbitrary ids; -1 is a one-sample group


def random_losses(seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    losses = torch.randn(len(GROUPS), 6, generator=gen, dtype=torch.float64)
    mask = torch.rand(len(GROUPS), 6, generator=gen) > 0.4
    mask[1] = False  # an empty sample inside a group
    mask[6:] = False  # a whole group with no trained token
    return losses.requires_grad_(), mask, torch.tensor(GROUPS)


def loop_aggregate(losses: Tensor, mask: Tensor, groups: list[int], mode: str) -> float:
    rows = [
        [losses[i, t].item() for t in range(losses.shape[1]) if mask[i, t]]
        for i in range(losses.shape[0])
    ]
    if mode == "token":
        count = sum(len(row) for row in rows)
        return sum(sum(row) for row in rows) / count
    if mode == "sample":
        means = [sum(row) / len(row) for row in rows if row]
        return sum(means) / len(means)
    per_group: dict[int, list[float]] = {}
    for row, group in zip(rows, groups, strict=True):
        per_group.setdefault(group, []).extend(row)
    means = [sum(values) / len(values) for values in per_group.values() if values]
    return sum(means) / len(means)


@pytest.mark.parametrize("mode", ["sample", "prompt", "token"])
def test_aggregation_matches_loop_definition(mode: str) -> None:
    losses, mask, groups = random_losses()
    value = aggregate(losses, mask, groups, mode)
    assert value.item() == pytest.approx(loop_aggregate(losses, mask, GROUPS, mode), abs=1e-12)


def test_modes_weigh_samples_differently() -> None:
    # One long and one short sample in one group, a second group with one sample.
    losses = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    groups = torch.tensor([0, 0, 1])
    assert aggregate(losses, mask, groups, "token").item() == pytest.approx(11 / 6)
    assert aggregate(losses, mask, groups, "sample").item() == pytest.approx((1 + 5 + 2) / 3)
    assert aggregate(losses, mask, groups, "prompt").item() == pytest.approx((9 / 5 + 2) / 2)


@pytest.mark.parametrize("mode", ["sample", "prompt", "token"])
def test_fully_masked_batch_aggregates_to_zero_with_zero_gradient(mode: str) -> None:
    losses, mask, groups = random_losses()
    value = aggregate(losses, torch.zeros_like(mask), groups, mode)
    (grad,) = torch.autograd.grad(value, losses)
    assert value.item() == 0.0
    assert torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("mode", ["sample", "prompt", "token"])
def test_untrained_nan_or_inf_never_leaks(mode: str) -> None:
    losses, mask, groups = random_losses()
    expected = aggregate(losses, mask, groups, mode)
    poisoned = losses.detach().masked_fill(~mask, math.nan)
    poisoned[0, ~mask[0]] = math.inf
    poisoned.requires_grad_()
    value = aggregate(poisoned, mask, groups, mode)
    (grad,) = torch.autograd.grad(value, poisoned)
    torch.testing.assert_close(value, expected.detach())
    assert torch.isfinite(grad).all()


def test_masked_mean_is_zero_not_nan_when_nothing_selected() -> None:
    values = torch.tensor([1.0, 2.0, 3.0])
    assert masked_mean(values, torch.tensor([True, False, True])).item() == 2.0
    assert masked_mean(values, torch.zeros(3)).item() == 0.0
    assert masked_mean(torch.empty(0), torch.empty(0, dtype=torch.bool)).item() == 0.0


def test_unknown_mode_and_bad_shapes_raise_input_error() -> None:
    losses, mask, groups = random_losses()
    with pytest.raises(InputError, match="unknown loss aggregation 'group'"):
        aggregate(losses, mask, groups, "group")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="mask"):
        aggregate(losses, mask[:, :2], groups, "token")
    with pytest.raises(InputError, match="group_index"):
        aggregate(losses, mask, groups[:3], "prompt")
