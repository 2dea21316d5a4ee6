"""The sampling filters (min-p, top-k, top-p) and the log-probs of the filtered distribution.

The importance ratio's denominator is the log-prob the generator recorded: vLLM's
`processed_logprobs`, the log-softmax of the logits it sampled from. With a filter on, that is a
renormalised distribution over the tokens the filters keep, so the trainer's numerator must be of
the same distribution, or an unchanged policy reads a ratio of 1/P(kept) instead of 1 on every
token. vLLM (0.32, its PyTorch path) builds it from the float32 logits of one position as:

1. tempered: divided by the temperature;
2. min-p: a token is dropped when its probability is below `min_p` times the largest
   probability (applied when `min_p` > 0);
3. top-k: a token is dropped when its logit is below the k-th largest kept logit, so tokens tied
   with the k-th are all kept (applied when 0 < `top_k` < vocabulary);
4. top-p: the kept logits sorted ascending, their softmax summed cumulatively, a token dropped
   while that sum is <= 1 - `top_p`; the most likely token is always kept (applied when
   `top_p` < 1);
5. the log-softmax over the kept tokens.

`filtered_logprobs` computes the same: the kept set is decided on the detached logits (no
gradient through the decision, which is a step function), and a token's log-prob is its tempered
logit less the log-sum-exp over the kept tokens, so the gradient flows through every kept
logit. The trainer's logits and the generator's differ by float error, so at a boundary (a
probability next to the min-p floor, a logit tied with the k-th, a cumulative sum next to
1 - `top_p`, or tokens tied where top-p's sort orders them arbitrarily) the two may keep
different sets. The sampled token is therefore always counted as kept: the generator sampled it,
so it was in its set, and dropping it here would make its log-prob -inf and the loss inf or NaN.
Such a token's ratio is off by the mass the two sets differ by, which is as small as the float
error that moved the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from scalerl.errors import InputError
from scalerl.recipe.entropy import token_entropy

if TYPE_CHECKING:
    from scalerl.spec.recipe import SamplingSpec

# Rows whose kept set is decided at once: top-p sorts the whole vocabulary of each row (values
# and int64 indices), ~12 bytes x vocabulary per row besides the logits themselves.
FILTER_ROWS = 256


@dataclass(frozen=True)
class SamplingFilters:
    """`recipe.sampling`'s filters; the defaults (1.0, 0, 0.0) are off and keep every token."""

    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1] (1: off); got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InputError(f"top_k must be an int >= 0 (0: off); got {self.top_k!r}")
        if not 0 <= self.min_p <= 1:
            raise InputError(f"min_p must be in [0, 1] (0: off); got {self.min_p}")

    @classmethod
    def of(cls, sampling: SamplingSpec) -> SamplingFilters:
        """The filters of a run's `recipe.sampling`."""
        return cls(top_p=sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p)

    @property
    def on(self) -> bool:
        """Whether any filter can drop a token."""
        return self.top_p < 1 or self.top_k > 0 or self.min_p > 0


NO_FILTERS = SamplingFilters()  # every token kept: plain tempered sampling


@torch.no_grad()
def kept_tokens(logits: Tensor, filters: SamplingFilters, sampled: Tensor | None = None) -> Tensor:
    """bool ``[rows, vocab]``: the tokens the filters keep from float32 tempered ``logits``
    ``[rows, vocab]``, in vLLM's order (module doc), plus each row's ``sampled`` token."""
    logits = logits.detach()
    kept = torch.ones_like(logits, dtype=torch.bool)
    if filters.on:
        for start in range(0, logits.shape[0], FILTER_ROWS):
            rows = slice(start, start + FILTER_ROWS)
            kept[rows] = _kept(logits[rows], filters)
    if sampled is not None:
        kept.scatter_(-1, sampled.unsqueeze(-1), True)
    return kept


def _kept(logits: Tensor, filters: SamplingFilters) -> Tensor:
    vocab = logits.shape[-1]
    kept = torch.ones_like(logits, dtype=torch.bool)
    if filters.min_p > 0:
        probs = logits.softmax(dim=-1)
        kept = probs >= probs.amax(dim=-1, keepdim=True) * filters.min_p
    if 0 < filters.top_k < vocab or filters.top_p < 1:
        logits = logits.masked_fill(~kept, -torch.inf)
    if 0 < filters.top_k < vocab:
        kth = logits.topk(filters.top_k, dim=-1).values[:, -1:]
        kept &= logits >= kth
        logits = logits.masked_fill(~kept, -torch.inf)
    if filters.top_p < 1:
        ascending, order = logits.sort(dim=-1)
        # 1 - p in float32, as the generator computes it from its float32 copy of p.
        floor = 1 - torch.tensor(filters.top_p, dtype=torch.float32, device=logits.device)
        dropped = ascending.softmax(dim=-1).cumsum(dim=-1) <= floor
        dropped[:, -1] = False  # the most likely token stays
        kept &= ~torch.empty_like(dropped).scatter_(-1, order, dropped)
    return kept


def filtered_logprobs(
    logits: Tensor, targets: Tensor, filters: SamplingFilters
) -> tuple[Tensor, Tensor]:
    """``(logprobs, entropy)`` ``[rows]`` of ``targets`` ``[rows]`` under the filtered
    distribution of float32 tempered ``logits`` ``[rows, vocab]`` (module doc: each target is
    kept). The gradient flows through the kept logits; the entropy (of the filtered
    distribution) carries none. With the filters off: the plain log-softmax, at no extra cost.

    ``logits`` is overwritten (the dropped tokens set to -inf) when a filter is on: one
    vocabulary-sized copy less per chunk.
    """
    if filters.on:
        logits = logits.masked_fill_(~kept_tokens(logits, filters, targets), -torch.inf)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    logprobs = picked - torch.logsumexp(logits, dim=-1)
    with torch.no_grad():
        entropy = token_entropy(logits.detach())
    return logprobs, entropy
