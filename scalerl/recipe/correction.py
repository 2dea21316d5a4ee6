"""Corrections for train-inference mismatch (`recipe.correction`), applied to the ratio every loss
uses before the loss sees it.

**What anchors the ratio.** ρ_t = π_θ(y_t) / π_gen(y_t), with π_gen the log-probability the
generator recorded for token t when it sampled it, under whichever policy version sampled that
token: with PipelineRL's in-flight updates the tokens of one sample may come from several versions,
and each token's ratio is anchored at its own. The trainer steps once per batch, so at its forward
π_θ is the policy of the trainer's current version: a token of lag 0 has ρ = mismatch alone, a
token of lag n mismatch times what n updates moved (`scalerl.recipe.mismatch` reports both apart).
CISPO's cap ε_max already truncates that ratio token by token; a correction acts on the same ratio,
so under lag it bounds lag-driven ratios too: set its bounds outside the spread the lag figures
show, or it discards what PipelineRL-k allows on purpose.

Let w_t = sg(ρ_t) (the ratio's value, no gradient) and, for ``sequence`` level, the sample's
geometric mean w_i = exp(mean over its trained tokens of log w_t).

- ``truncate``: the ratio is capped at ``cap``: where w > cap its anchor is raised by
  log(w / cap), so the ratio reads ``cap`` and its gradient scales alike (ρ∇log π with ρ = cap).
  Token level caps each token; sequence level lowers every token of a sample whose w_i > cap by
  the same factor, so the sample's mean reads ``cap``. With CISPO, token truncation at cap c is
  ε_max = min(ε_max, c).
- ``mask``: tokens (token level) or whole samples (sequence level) whose w lies outside
  [``low``, ``high``] get a loss of 0. They stay in the aggregation's denominators, so masking
  never weighs the remaining tokens up, and micro-batches still add up to the full batch.

``none`` (the default, the paper's: CISPO with an FP32 LM head) leaves the ratio as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from scalerl.errors import InputError
from scalerl.recipe.mismatch import LOG_RATIO_LIMIT
from scalerl.spec import CORRECTION_CAP, CORRECTION_HIGH, CORRECTION_LOW

CorrectionType = Literal["none", "truncate", "mask"]
CorrectionLevel = Literal["token", "sequence"]


@dataclass(frozen=True)
class Correction:
    """`recipe.correction` as the loss applies it."""

    type: CorrectionType = "none"
    level: CorrectionLevel = "token"
    cap: float = CORRECTION_CAP
    low: float = CORRECTION_LOW
    high: float = CORRECTION_HIGH

    def __post_init__(self) -> None:
        if self.type not in ("none", "truncate", "mask"):
            raise InputError(f"unknown correction {self.type!r}; choose none, truncate or mask")
        if self.level not in ("token", "sequence"):
            raise InputError(f"unknown correction level {self.level!r}; choose token or sequence")
        if not self.cap >= 1:
            raise InputError(f"correction cap must be >= 1; got {self.cap}")
        if not 0 < self.low <= 1 <= self.high:
            raise InputError(
                f"correction bounds must hold 1 (0 < low <= 1 <= high); "
                f"got [{self.low}, {self.high}]"
            )


@dataclass(frozen=True)
class Corrected:
    """The anchor the loss uses instead of the generator's log-probs, a per-token weight on the
    loss (0 where masked) and where the correction changed anything."""

    old_logprobs: Tensor
    weight: Tensor
    changed: Tensor  # bool [samples, tokens], trained tokens only


@torch.no_grad()
def correct(
    logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, correction: Correction
) -> Corrected:
    """``correction`` applied to ``[samples, tokens]`` log-probs over the trained ``mask``."""
    ones = torch.ones_like(old_logprobs)
    if correction.type == "none":
        return Corrected(old_logprobs, ones, torch.zeros_like(mask))
    log_w = torch.where(mask, logprobs.detach() - old_logprobs, 0.0)
    log_w = log_w.nan_to_num(nan=LOG_RATIO_LIMIT).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    if correction.level == "sequence":
        tokens = mask.sum(dim=-1, keepdim=True).clamp(min=1)
        log_w = (log_w.sum(dim=-1, keepdim=True) / tokens).expand_as(log_w)
    if correction.type == "truncate":
        excess = (log_w - math.log(correction.cap)).clamp(min=0.0)
        if correction.level == "token":  # exact even where the generator's log-prob is -inf
            anchor = torch.maximum(old_logprobs, logprobs.detach() - math.log(correction.cap))
        else:
            anchor = old_logprobs + excess
        changed = mask & (excess > 0)
        return Corrected(torch.where(changed, anchor, old_logprobs), ones, changed)
    changed = mask & ((log_w < math.log(correction.low)) | (log_w > math.log(correction.high)))
    return Corrected(old_logprobs, (~changed).to(old_logprobs.dtype), changed)
