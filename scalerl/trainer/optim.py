"""The optimizer of the paper: AdamW, linear warm-up, then a constant learning rate.

Paper values: lr 5e-7, 100 warm-up steps, eps 1e-15, weight decay 0.01, no KL term. The tiny eps
matters: with lr 5e-7 and small gradients, the default 1e-8 would dominate Adam's denominator.

Choices the paper leaves open:

- Weight decay applies to every parameter (biases and norms included), as `torch.optim.AdamW` does
  with one parameter group; at 0.01 × 5e-7 per step the difference is immaterial.
- Warm-up: the optimizer step with index k (0-based) uses ``lr · min(1, (k + 1) / warmup_steps)``,
  so no step is spent at lr 0 and step ``warmup_steps`` (1-based) is the first at the full rate.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from scalerl.errors import InputError


class LinearWarmup:
    """LambdaLR factor: ramps linearly to 1 over ``steps`` optimizer steps, then stays at 1.

    A class rather than a closure so it pickles (checkpoints hold the scheduler's state).
    """

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, step: int) -> float:
        if self.steps <= 0:
            return 1.0
        return min(1.0, (step + 1) / self.steps)


def build_optimizer(
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    weight_decay: float,
    eps: float,
    warmup_steps: int,
) -> tuple[torch.optim.AdamW, LRScheduler]:
    """AdamW over ``params`` and its warm-up scheduler; step the scheduler after each step."""
    if not lr > 0:
        raise InputError(f"learning rate must be > 0; got {lr}")
    if weight_decay < 0 or eps <= 0 or warmup_steps < 0:
        raise InputError(
            f"need weight_decay >= 0, eps > 0, warmup_steps >= 0; got {weight_decay}, {eps}, "
            f"{warmup_steps}"
        )
    trainable = [p for p in params if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, eps=eps)
    scheduler = LambdaLR(optimizer, LinearWarmup(warmup_steps))
    return optimizer, scheduler
