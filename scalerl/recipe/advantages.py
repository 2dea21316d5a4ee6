"""Group-relative advantages (paper: "Advantage"; ScaleRL normalises by the batch).

Â_i = r_i − mean_j r_j over the samples j of sample i's prompt group, then

- ``batch`` (ScaleRL): divide every Â by the std of all centred Â in the batch, plus ε;
- ``prompt``: divide by the std of the group's rewards, plus ε;
- ``none``: mean-centred only.

Choice (the paper does not say): std is the population std (``correction=0``). It is defined for a
single value, so one-sample groups and one-sample batches stay finite without special cases, and
for G = 16 it differs from Bessel's by 3 %, a constant scale that Adam absorbs.

Advantages are constants of the objective (the loss stops gradients through them), so the result is
detached. Pass only the effective batch: drop truncated samples and zero-variance groups first (see
`scalerl.recipe.filters`), since ``batch`` statistics depend on which samples are present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from scalerl.errors import InputError
from scalerl.recipe.aggregation import dense_groups, group_sums
from scalerl.recipe.filters import zero_variance_groups

Normalization = Literal["batch", "prompt", "none"]
# (centred advantages, rewards, per-sample dense group id, number of groups, eps) -> advantages
Normalizer = Callable[[Tensor, Tensor, Tensor, int, float], Tensor]


def _by_batch(centred: Tensor, rewards: Tensor, inverse: Tensor, groups: int, eps: float) -> Tensor:
    return centred / (centred.std(correction=0) + eps)


def _by_prompt(
    centred: Tensor, rewards: Tensor, inverse: Tensor, groups: int, eps: float
) -> Tensor:
    # The group's reward std equals the std of its centred rewards; reuse them.
    counts = group_sums(torch.ones_like(centred), inverse, groups)
    variance = group_sums(centred.square(), inverse, groups) / counts
    return centred / (variance.sqrt()[inverse] + eps)


def _centred_only(
    centred: Tensor, rewards: Tensor, inverse: Tensor, groups: int, eps: float
) -> Tensor:
    return centred


NORMALIZERS: dict[str, Normalizer] = {
    "batch": _by_batch,
    "prompt": _by_prompt,
    "none": _centred_only,
}


def compute_advantages(
    rewards: Tensor,
    group_index: Tensor,
    normalization: Normalization = "batch",
    eps: float = 1e-6,
) -> Tensor:
    """Advantages ``[samples]`` from ``rewards[samples]`` grouped by ``group_index[samples]``.

    ``group_index`` may hold any integers (one id per prompt group, not necessarily 0..G-1). A
    one-sample group, or a batch whose groups all have equal rewards, gives advantages of exactly 0.
    """
    normalizer = NORMALIZERS.get(normalization)
    if normalizer is None:
        raise InputError(
            f"unknown advantage normalization {normalization!r}; "
            f"choose one of {sorted(NORMALIZERS)}"
        )
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise InputError(
            f"rewards and group_index must both be [samples]; got {tuple(rewards.shape)} "
            f"and {tuple(group_index.shape)}"
        )
    if group_index.dtype.is_floating_point or group_index.dtype == torch.bool:
        raise InputError(f"group_index must hold integer ids; got dtype {group_index.dtype}")
    values = rewards.detach()
    if not values.dtype.is_floating_point:
        values = values.to(torch.get_default_dtype())
    if values.numel() == 0:
        return values.clone()
    inverse, groups = dense_groups(group_index)
    counts = group_sums(torch.ones_like(values), inverse, groups)
    means = group_sums(values, inverse, groups) / counts
    # Equal rewards centre to exactly 0 in exact arithmetic; pin it so rounding in the mean can
    # never leave such a group a tiny nonzero gradient (or blow it up under prompt normalisation).
    centred = torch.where(zero_variance_groups(values, group_index), 0.0, values - means[inverse])
    return normalizer(centred, values, inverse, groups, eps)
