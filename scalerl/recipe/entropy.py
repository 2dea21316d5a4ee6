"""Token entropy of the policy: a health metric the paper tracks (it falls in every run).

The masked mean that turns it into one number is `scalerl.recipe.aggregation.masked_mean`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy ``H = −Σ_v p_v log p_v`` (nats) of each distribution in ``logits[..., vocab]``.

    Computed in float32 whatever the input dtype (bf16 logits lose the small probabilities that
    matter here), through ``log_softmax`` so large logits cannot overflow. Vocabulary entries with
    p = 0 (e.g. logits of ``-inf``) add 0 rather than ``0 · −inf = NaN``. The float32 copy costs
    ``4 · numel`` bytes: for long sequences and large vocabularies, call it on chunks.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    probs = log_probs.exp()
    return -torch.where(probs > 0, probs * log_probs, 0.0).sum(dim=-1)
