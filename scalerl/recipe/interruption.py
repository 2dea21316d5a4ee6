"""Forced length interruption (paper: when the thinking budget is hit, inject a phrase).

When a sample's thinking reaches the cutoff without closing, the generator appends the phrase
"Okay, time is up. Let me stop thinking and formulate a final answer now. </think>" and lets the
model write its answer within ``answer_budget`` tokens. The cutoff is drawn uniformly from
``window`` (paper: [10k, 12k] of a 12,288-token thinking budget) so the model does not learn one
fixed stopping point.

The phrase tokens were not sampled from the policy (the paper does not say whether they are
trained on), so their loss mask is 0: the trainer must not push probability onto text the model
did not choose, and the generator has no sampling log-probability for them anyway.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from scalerl.errors import InputError
from scalerl.spec import LengthSpec


@dataclass(frozen=True)
class InterruptionPlan:
    """Token budgets and the window the thinking cutoff is drawn from.

    ``thinking_budget``: most thinking tokens (paper 12,288). ``answer_budget``: most answer tokens
    after the cutoff (paper 2,048). ``window``: (lo, hi) inclusive range of the cutoff, with
    0 < lo <= hi <= thinking_budget (paper (10240, 12288)). ``enabled=False``: the cutoff is always
    ``thinking_budget``, i.e. a plain hard limit.
    """

    thinking_budget: int
    answer_budget: int
    window: tuple[int, int]
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.thinking_budget <= 0:
            raise InputError(f"thinking_budget must be > 0 tokens; got {self.thinking_budget}")
        if self.answer_budget <= 0:
            raise InputError(f"answer_budget must be > 0 tokens; got {self.answer_budget}")
        if len(self.window) != 2:
            raise InputError(f"interruption window must be [lo, hi]; got {list(self.window)}")
        lo, hi = self.window
        if self.enabled and not 0 < lo <= hi <= self.thinking_budget:  # unused when disabled
            raise InputError(
                f"interruption window [{lo}, {hi}] must satisfy 0 < lo <= hi <= thinking_budget "
                f"({self.thinking_budget})"
            )

    @classmethod
    def of(cls, length: LengthSpec) -> InterruptionPlan:
        """The plan of a run's `recipe.length`."""
        return cls(
            thinking_budget=length.thinking_budget,
            answer_budget=length.answer_budget,
            window=length.interruption.window,
            enabled=length.interruption.enabled,
        )

    def cutoff(self, rng: random.Random) -> int:
        """Thinking tokens after which this sample is interrupted (uniform in window, inclusive)."""
        if not self.enabled:
            return self.thinking_budget
        lo, hi = self.window
        return rng.randint(lo, hi)


def completion_loss_mask(thinking_tokens: int, phrase_tokens: int, answer_tokens: int) -> list[int]:
    """Loss mask of a completion laid out as thinking, injected phrase, answer (1 = trained)."""
    if min(thinking_tokens, phrase_tokens, answer_tokens) < 0:
        raise InputError(
            f"token counts must be >= 0; got thinking={thinking_tokens}, "
            f"phrase={phrase_tokens}, answer={answer_tokens}"
        )
    return [1] * thinking_tokens + [0] * phrase_tokens + [1] * answer_tokens


def splice(thinking_ids: Sequence[int], phrase_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """Thinking followed by the injected phrase, and its loss mask (0 on the phrase)."""
    ids = [*thinking_ids, *phrase_ids]
    return ids, completion_loss_mask(len(thinking_ids), len(phrase_ids), 0)
