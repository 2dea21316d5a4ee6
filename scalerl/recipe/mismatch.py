"""Train-inference mismatch: the trainer's and the generator's log-probabilities of the same
tokens, told apart from policy lag.

For a trained token y, Δ = log π_trainer(y) − log π_generator(y), the log of the ratio every loss
uses (ρ = e^Δ), and its lag = the trainer's policy version − the oldest version that computed y:
the one that sampled it, or an older one whose keys and values y read (an in-flight update keeps
the engine's KV cache, so a token sampled after it still reads the prompt and the earlier tokens
as the older weights computed them). At lag 0 everything that produced y came from the very
weights the trainer holds, so Δ is numeric mismatch alone (kernels, dtype, the LM head's
precision, sampling settings); at lag n it is mismatch plus what up to n updates moved the
policy. (The batch's policy lag counts each token's own version: it is never above the mean of
these lags, and equal to it when no sample spans an update.) Figures per lag, over the trained
tokens of one step:

- ``kl``: the k3 estimate of KL(π_generator ‖ π_trainer), the mean of (ρ − 1) − log ρ: unbiased
  for tokens the generator sampled, and ≥ 0 token by token (so a few tokens never cancel out);
- ``abs_mean``, ``abs_max``: of |Δ|;
- ``outside``: the fraction of tokens whose ρ leaves ``RATIO_BAND``;
- ``tokens``: how many tokens the figures are over.

Sums are kept per lag so micro-batches and trainer ranks add up exactly; Δ is taken within
±``LOG_RATIO_LIMIT`` (a ratio of e^20 says all there is to say) so one absurd token cannot turn a
step's figures into inf or NaN.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

RATIO_BAND = (0.8, 1.25)
LOG_RATIO_LIMIT = 20.0


@dataclass
class LagSums:
    """Running sums over one lag's tokens."""

    tokens: int = 0
    k3: float = 0.0
    abs_sum: float = 0.0
    abs_max: float = 0.0
    outside: int = 0

    def add(self, other: LagSums) -> None:
        self.tokens += other.tokens
        self.k3 += other.k3
        self.abs_sum += other.abs_sum
        self.abs_max = max(self.abs_max, other.abs_max)
        self.outside += other.outside


@dataclass(frozen=True)
class LagFigures:
    """One lag's figures (see the module docstring)."""

    kl: float
    abs_mean: float
    abs_max: float
    outside: float
    tokens: int

    def as_dict(self) -> dict[str, float]:
        return {
            "kl": self.kl,
            "abs_mean": self.abs_mean,
            "abs_max": self.abs_max,
            "outside": self.outside,
            "tokens": self.tokens,
        }


@torch.no_grad()
def mismatch_sums(
    logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, lags: Tensor
) -> dict[int, LagSums]:
    """Per lag, the sums over the trained tokens (``mask``) of ``[samples, tokens]`` tensors:
    the trainer's ``logprobs``, the generator's ``old_logprobs`` and each token's ``lags``."""
    trained = mask.to(torch.bool)
    delta = logprobs.detach()[trained].double() - old_logprobs[trained].double()
    delta = delta.nan_to_num(nan=LOG_RATIO_LIMIT).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    token_lags = lags[trained]
    low, high = (torch.log(torch.tensor(bound, dtype=torch.float64)) for bound in RATIO_BAND)
    out: dict[int, LagSums] = {}
    for lag in token_lags.unique().tolist():
        d = delta[token_lags == lag]
        magnitude = d.abs()
        values = torch.stack(
            [
                (torch.expm1(d) - d).sum(),  # expm1: no cancellation for tiny Δ
                magnitude.sum(),
                magnitude.max(),
                ((d < low) | (d > high)).sum().double(),
            ]
        ).tolist()  # one device sync for the four
        out[int(lag)] = LagSums(int(d.numel()), values[0], values[1], values[2], int(values[3]))
    return out


def merge(parts: Iterable[dict[int, LagSums]]) -> dict[int, LagSums]:
    """The sums of several micro-batches (or ranks) as one."""
    total: dict[int, LagSums] = {}
    for part in parts:
        for lag, sums in part.items():
            total.setdefault(lag, LagSums()).add(sums)
    return total


def figures(sums: dict[int, LagSums]) -> dict[int, LagFigures]:
    """Per lag (ascending), the figures of the sums; lags without tokens are left out."""
    return {
        lag: LagFigures(
            kl=s.k3 / s.tokens,
            abs_mean=s.abs_sum / s.tokens,
            abs_max=s.abs_max,
            outside=s.outside / s.tokens,
            tokens=s.tokens,
        )
        for lag, s in sorted(sums.items())
        if s.tokens
    }
