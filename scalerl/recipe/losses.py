"""Policy-gradient losses of the paper, each one pure per-token function, chosen by name once.

Notation: ρ_it = exp(log π(y_it) − log π_old(y_it)) with π the trainer's policy and π_old the
generator's recorded probability; Â_i the sample's advantage; sg = stop-gradient. Every function
returns the per-token loss to *minimise* (the negated objective), 0 on untrained tokens; the
aggregation (`scalerl.recipe.aggregation`) then turns it into one scalar.

- ``cispo`` (ScaleRL): ℓ_it = −sg(min(ρ_it, ε_max)) · Â_i · log π(y_it). Only an upper cap, no lower
  clip; the gradient flows through log π alone.
- ``dapo``: ℓ_it = −min(ρ_it Â_i, clip(ρ_it, 1−ε_low, 1+ε_high) Â_i), gradient through ρ.
- ``grpo``: the same clipped surrogate; the paper's GRPO uses ε = 0.2 on both sides and ``sample``
  aggregation, which the caller chooses.
- ``gspo``: sequence ratio s_i = exp(mean over trained tokens of log ρ_it) and sample loss
  L_i = −min(s_i Â_i, clip(s_i, 1−ε_low, 1+ε_high) Â_i), written as ℓ_it = L_i on each trained
  token of sample i so that every aggregation applies: ``sample`` gives mean_i L_i (the GSPO
  paper's objective); ``token`` gives Σ_i |y_i| L_i / Σ_i |y_i| (long samples weigh more);
  ``prompt`` gives per prompt the token-weighted mean of its L_i, then the mean over prompts.
  The paper's working GSPO clips are ~1e-3 (ε_low 3e-3, ε_high 4e-3 to 5e-3), not 0.2/0.28.

π_old and Â are constants of the objective, so they are detached here. Untrained positions are
selected away before any exp/product, so padding holding ``-inf`` never yields inf or NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from scalerl.errors import InputError
from scalerl.recipe.aggregation import AggregationMode, aggregate, masked_mean
from scalerl.recipe.correction import Correction, correct
from scalerl.spec import EPSILON_HIGH, EPSILON_LOW, EPSILON_MAX

LossName = Literal["cispo", "dapo", "grpo", "gspo"]
NO_CORRECTION = Correction()
STAT_NAMES = (
    "clip_fraction",
    "corrected_fraction",
    "ratio_mean",
    "ratio_max",
    "ratio_min",
    "tokens",
)


@dataclass(frozen=True)
class ClipRange:
    """Ratio limits: CISPO's cap ``epsilon_max``; the clipped surrogates' ``1 ± epsilon``."""

    epsilon_max: float = EPSILON_MAX
    epsilon_low: float = EPSILON_LOW
    epsilon_high: float = EPSILON_HIGH

    def __post_init__(self) -> None:
        if not self.epsilon_max > 0:
            raise InputError(f"epsilon_max must be > 0; got {self.epsilon_max}")
        if not 0 <= self.epsilon_low < 1:
            raise InputError(f"epsilon_low must be in [0, 1); got {self.epsilon_low}")
        if not self.epsilon_high >= 0:
            raise InputError(f"epsilon_high must be >= 0; got {self.epsilon_high}")


@dataclass(frozen=True)
class TokenLosses:
    """What a loss function returns: all ``[samples, tokens]``."""

    losses: Tensor  # per-token loss to minimise, 0 on untrained tokens
    ratio: Tensor  # the ratio the loss used (ρ_it, or s_i on each token for gspo), detached
    clipped: Tensor  # bool: the cap/clip changed this token's gradient


# (logprobs, old_logprobs, advantages, bool mask, clip range) -> TokenLosses
LossFunction = Callable[[Tensor, Tensor, Tensor, Tensor, ClipRange], TokenLosses]


def _log_ratio(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    # where(), not multiply: -inf - -inf on padding would otherwise become NaN.
    return torch.where(mask, logprobs - old_logprobs, 0.0)


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, clip: ClipRange) -> tuple[Tensor, Tensor]:
    """−min(ρÂ, clip(ρ)Â) and where the clipped branch wins (so the gradient is cut)."""
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip.epsilon_low, 1 + clip.epsilon_high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def cispo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip: ClipRange
) -> TokenLosses:
    """CISPO: −sg(min(ρ, ε_max))·Â·log π per token."""
    ratio = _log_ratio(logprobs, old_logprobs, mask).detach().exp()
    weight = ratio.clamp(max=clip.epsilon_max)
    trained_logprobs = torch.where(mask, logprobs, 0.0)
    losses = -(weight * advantages[:, None] * trained_logprobs)
    return TokenLosses(losses, ratio, mask & (ratio > clip.epsilon_max))


def clipped_surrogate_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip: ClipRange
) -> TokenLosses:
    """DAPO / GRPO: −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â) per token."""
    ratio = _log_ratio(logprobs, old_logprobs, mask).exp()
    losses, clipped = _clipped_surrogate(ratio, advantages[:, None], clip)
    return TokenLosses(torch.where(mask, losses, 0.0), ratio.detach(), mask & clipped)


def gspo_loss(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, clip: ClipRange
) -> TokenLosses:
    """GSPO: the clipped surrogate on the sequence ratio s_i, spread over the sample's tokens."""
    tokens = mask.sum(dim=-1).clamp(min=1).to(logprobs.dtype)
    sequence_ratio = (_log_ratio(logprobs, old_logprobs, mask).sum(dim=-1) / tokens).exp()
    sample_losses, clipped = _clipped_surrogate(sequence_ratio, advantages, clip)
    spread = sample_losses[:, None].expand_as(logprobs)
    ratio = sequence_ratio.detach()[:, None].expand_as(logprobs)
    return TokenLosses(torch.where(mask, spread, 0.0), ratio, mask & clipped[:, None])


LOSSES: dict[str, LossFunction] = {
    "cispo": cispo_loss,
    "dapo": clipped_surrogate_loss,
    "grpo": clipped_surrogate_loss,
    "gspo": gspo_loss,
}


def loss_function(name: str) -> LossFunction:
    """The registered loss called ``name``; InputError naming the choices otherwise."""
    function = LOSSES.get(name)
    if function is None:
        raise InputError(f"unknown loss {name!r}; choose one of {sorted(LOSSES)}")
    return function


def _check_shapes(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, group_index: Tensor
) -> None:
    if logprobs.dim() != 2 or not logprobs.shape == old_logprobs.shape == mask.shape:
        raise InputError(
            f"logprobs, old_logprobs and mask must all be [samples, tokens]; got "
            f"{tuple(logprobs.shape)}, {tuple(old_logprobs.shape)} and {tuple(mask.shape)}"
        )
    samples = logprobs.shape[:1]
    if advantages.shape != samples or group_index.shape != samples:
        raise InputError(
            f"advantages and group_index must be [samples] = {tuple(samples)}; got "
            f"{tuple(advantages.shape)} and {tuple(group_index.shape)}"
        )


@torch.no_grad()
def _stats(out: TokenLosses, mask: Tensor, corrected: Tensor) -> dict[str, float]:
    """Ratio and clipping statistics over trained tokens (0 where there are none)."""
    if mask.numel() == 0:
        return dict.fromkeys(STAT_NAMES, 0.0)
    tokens = mask.sum()
    present = tokens > 0
    ratio = out.ratio
    values = torch.stack(
        [
            masked_mean(out.clipped.to(ratio.dtype), mask),
            masked_mean(corrected.to(ratio.dtype), mask),
            masked_mean(ratio, mask),
            torch.where(present, torch.where(mask, ratio, -torch.inf).amax(), 0.0),
            torch.where(present, torch.where(mask, ratio, torch.inf).amin(), 0.0),
            tokens.to(ratio.dtype),
        ]
    ).tolist()  # one device sync for all of them
    return dict(zip(STAT_NAMES, values, strict=True))


def compute_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    group_index: Tensor,
    *,
    loss: LossName = "cispo",
    aggregation: AggregationMode = "prompt",
    epsilon_max: float = EPSILON_MAX,
    epsilon_low: float = EPSILON_LOW,
    epsilon_high: float = EPSILON_HIGH,
    correction: Correction = NO_CORRECTION,
) -> tuple[Tensor, dict[str, float]]:
    """The scalar loss to minimise and its statistics.

    ``logprobs``/``old_logprobs``/``mask`` are ``[samples, tokens]`` (mask bool or 0/1 float,
    nonzero = trained token); ``advantages``/``group_index`` are ``[samples]``. ``epsilon_max`` is
    used by ``cispo`` only, ``epsilon_low``/``epsilon_high`` by the clipped losses only;
    ``correction`` (scalerl.recipe.correction) acts on the ratio before the loss sees it. Stats:
    ``clip_fraction`` (trained tokens whose gradient the cap/clip changed),
    ``corrected_fraction`` (trained tokens the correction truncated or masked), ``ratio_mean``,
    ``ratio_max``, ``ratio_min`` (of the ratio the loss used), ``tokens`` (trained tokens).
    """
    function = loss_function(loss)
    clip = ClipRange(epsilon_max, epsilon_low, epsilon_high)
    _check_shapes(logprobs, old_logprobs, advantages, mask, group_index)
    trained = mask.to(torch.bool)
    corrected = correct(logprobs, old_logprobs.detach(), trained, correction)
    out = function(
        logprobs, corrected.old_logprobs, advantages.detach().to(logprobs.dtype), trained, clip
    )
    losses = out.losses * corrected.weight
    stats = _stats(out, trained, corrected.changed)
    return aggregate(losses, trained, group_index, aggregation), stats
