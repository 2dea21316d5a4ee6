"""Loss aggregation: how per-token losses of a batch become the one scalar we minimise.

Paper (ScaleRL, "Loss aggregation"), with |y_i| the trained tokens of sample i and G_p the samples
of prompt p:

- ``sample``: mean over samples of each sample's token mean, ``1/N Σ_i (1/|y_i|) Σ_t ℓ_it``.
- ``prompt`` (ScaleRL's choice): per prompt, the sum of its samples' token losses over the total
  tokens of those samples, then the mean over prompts,
  ``1/P Σ_p (Σ_{i∈G_p} Σ_t ℓ_it) / (Σ_{i∈G_p} |y_i|)``.
- ``token``: sum over the batch over tokens in the batch, ``Σ_i Σ_t ℓ_it / Σ_i |y_i|``.

Samples or prompts with no trained token are absent from the mean (they neither add a term nor
count in its denominator). A batch with no trained token at all aggregates to an exact 0 that is
still connected to the graph, so ``backward()`` works and gives zero gradients, never NaN.

Untrained positions are selected away with ``torch.where`` rather than multiplied by the mask, so
padding holding ``-inf`` or garbage can never turn into NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from scalerl.errors import InputError

AggregationMode = Literal["sample", "prompt", "token"]
Aggregator = Callable[[Tensor, Tensor, Tensor], Tensor]


def dense_groups(group_index: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer group ids to ``0..G-1`` per sample; returns (inverse, G)."""
    uniques, inverse = torch.unique(group_index, return_inverse=True)
    return inverse, int(uniques.numel())


def group_sums(values: Tensor, inverse: Tensor, groups: int) -> Tensor:
    """Sum ``values`` (first dim = samples) into ``groups`` rows indexed by ``inverse``."""
    out = values.new_zeros((groups, *values.shape[1:]))
    return out.index_add_(0, inverse, values)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` where ``mask`` is nonzero; exactly 0 (never NaN) if none is selected."""
    selected = mask.to(torch.bool)
    total = torch.where(selected, values, 0.0).sum()
    return total / selected.sum().clamp(min=1).to(total.dtype)


def _row_totals(token_losses: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample sum of trained-token losses and per-sample trained-token count."""
    sums = torch.where(mask, token_losses, 0.0).sum(dim=-1)
    return sums, mask.sum(dim=-1).to(sums.dtype)


def _mean_of_present(values: Tensor, present: Tensor) -> Tensor:
    """Mean of ``values`` over the rows that exist (``present``); 0 when none do."""
    total = torch.where(present, values, 0.0).sum()
    return total / present.sum().clamp(min=1).to(total.dtype)


def _sample_mean(token_losses: Tensor, mask: Tensor, group_index: Tensor) -> Tensor:
    sums, tokens = _row_totals(token_losses, mask)
    return _mean_of_present(sums / tokens.clamp(min=1), tokens > 0)


def _prompt_mean(token_losses: Tensor, mask: Tensor, group_index: Tensor) -> Tensor:
    sums, tokens = _row_totals(token_losses, mask)
    inverse, groups = dense_groups(group_index)
    group_loss = group_sums(sums, inverse, groups)
    group_tokens = group_sums(tokens, inverse, groups)
    return _mean_of_present(group_loss / group_tokens.clamp(min=1), group_tokens > 0)


def _token_mean(token_losses: Tensor, mask: Tensor, group_index: Tensor) -> Tensor:
    return masked_mean(token_losses, mask)


AGGREGATIONS: dict[str, Aggregator] = {
    "sample": _sample_mean,
    "prompt": _prompt_mean,
    "token": _token_mean,
}


def aggregate(
    token_losses: Tensor, mask: Tensor, group_index: Tensor, mode: AggregationMode = "prompt"
) -> Tensor:
    """Reduce ``token_losses[samples, tokens]`` to a scalar with the paper's ``mode``.

    ``mask[samples, tokens]`` (bool or 0/1 float; nonzero = trained token) selects the tokens;
    ``group_index[samples]`` holds any integer id per prompt (only ``prompt`` mode reads it).
    """
    aggregator = AGGREGATIONS.get(mode)
    if aggregator is None:
        raise InputError(f"unknown loss aggregation {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    if token_losses.dim() != 2 or mask.shape != token_losses.shape:
        raise InputError(
            f"token losses and mask must both be [samples, tokens]; got "
            f"{tuple(token_losses.shape)} and {tuple(mask.shape)}"
        )
    if group_index.shape != token_losses.shape[:1]:
        raise InputError(
            f"group_index must be [samples] = {tuple(token_losses.shape[:1])}; "
            f"got {tuple(group_index.shape)}"
        )
    return aggregator(token_losses, mask.to(torch.bool), group_index)
