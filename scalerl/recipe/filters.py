"""Which samples make the effective batch (paper: zero-variance filtering, truncation).

Two rules, both from the paper:

- **Truncation**: a sample that hit the hard length limit (even after forced interruption) is left
  out of the effective batch: it adds no loss term and takes no part in the advantage statistics
  (neither its group's mean/std nor the batch std).
- **Zero-variance filtering**: a prompt group whose rewards are all equal has Â = 0 for every
  sample, so it carries no gradient; it is dropped from the loss (not resampled). Dropping it
  before advantages matters for ``batch`` normalisation, whose std would otherwise be diluted by
  zeros. The ScaleRL objective averages over prompts with 0 < pass rate < 1, i.e. over the rest.

Use: ``keep = effective_sample_mask(truncated, rewards, group_index)``, then index every per-sample
tensor with ``keep`` and compute advantages and the loss on what remains.
"""

from __future__ import annotations

import torch
from torch import Tensor

from scalerl.errors import InputError
from scalerl.recipe.aggregation import dense_groups


def zero_variance_groups(rewards: Tensor, group_index: Tensor) -> Tensor:
    """BoolTensor[samples]: True where every reward in the sample's group is equal.

    A one-sample group counts as zero-variance (its advantage is 0 by construction).
    """
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise InputError(
            f"rewards and group_index must both be [samples]; got {tuple(rewards.shape)} "
            f"and {tuple(group_index.shape)}"
        )
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    inverse, groups = dense_groups(group_index)
    values = rewards.detach()
    empty = values.new_zeros(groups)
    highest = empty.scatter_reduce(0, inverse, values, "amax", include_self=False)
    lowest = empty.scatter_reduce(0, inverse, values, "amin", include_self=False)
    return (highest == lowest)[inverse]


def effective_sample_mask(
    truncated: Tensor,
    rewards: Tensor,
    group_index: Tensor,
    *,
    drop_zero_variance: bool = True,
) -> Tensor:
    """BoolTensor[samples]: True for samples that stay in the effective batch.

    Truncated samples go first; zero variance is then judged on each group's *remaining* samples
    (a group of 15 correct answers and one truncated one is zero-variance and goes too). A group
    with a single remaining sample is zero-variance as well. ``drop_zero_variance=False`` applies
    the truncation rule alone.
    """
    if rewards.dim() != 1 or not truncated.shape == group_index.shape == rewards.shape:
        raise InputError(
            f"truncated, rewards and group_index must all be [samples]; got "
            f"{tuple(truncated.shape)}, {tuple(rewards.shape)} and {tuple(group_index.shape)}"
        )
    keep = ~truncated.to(torch.bool)
    if not drop_zero_variance:
        return keep
    flat = zero_variance_groups(rewards[keep], group_index[keep])
    kept_positions = keep.nonzero(as_tuple=True)[0]
    return keep.index_put((kept_positions,), ~flat)
