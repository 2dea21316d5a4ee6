"""No-Positive-Resampling curriculum (paper): prompts the policy has mastered leave for good.

The paper keeps each prompt's pass-rate history and removes a prompt whose pass rate reaches 0.9
from later epochs, without saying how the history is aggregated. Choice: the pass rate that
counts is that of the prompt's **most recent group** of samples, i.e. the current policy's; older
groups came from weaker policies and would hold back a prompt the policy now solves. Removal is
permanent: a later, lower pass rate never brings a prompt back (nor does a new threshold).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import Tensor

from scalerl.errors import InputError

STATE_VERSION = 1


def pass_rate(rewards_or_pass_rate: float | Sequence[float] | Tensor) -> float:
    """Pass rate in [0, 1] from a number (taken as the pass rate) or from a group's rewards.

    Rewards (a sequence or a tensor of any shape) are ±1 for correct/incorrect: the pass rate is
    the fraction of rewards > 0.
    """
    if isinstance(rewards_or_pass_rate, bool):
        raise InputError("a pass rate must be a number in [0, 1] or a group's rewards, not a bool")
    if isinstance(rewards_or_pass_rate, int | float):
        rate = float(rewards_or_pass_rate)
        if not 0.0 <= rate <= 1.0:  # also rejects NaN
            raise InputError(f"pass rate must be in [0, 1]; got {rate}")
        return rate
    rewards = (
        rewards_or_pass_rate.detach().flatten().tolist()
        if isinstance(rewards_or_pass_rate, Tensor)
        else list(rewards_or_pass_rate)
    )
    if not rewards:
        raise InputError("cannot compute a pass rate from an empty group of rewards")
    return sum(1 for reward in rewards if reward > 0) / len(rewards)


class NoPositiveResampling:
    """Per-prompt pass-rate record that permanently drops prompts at or above ``threshold``."""

    def __init__(self, threshold: float = 0.9) -> None:
        if not 0.0 < threshold <= 1.0:
            raise InputError(f"pass-rate threshold must be in (0, 1]; got {threshold}")
        self.threshold = threshold
        self._last_pass_rate: dict[str, float] = {}
        self._observations: dict[str, int] = {}
        self._dropped: set[str] = set()

    def observe(
        self, prompt_id: str, rewards_or_pass_rate: float | Sequence[float] | Tensor
    ) -> bool:
        """Record the prompt's newest group (rewards or pass rate); True if it stays active."""
        rate = pass_rate(rewards_or_pass_rate)
        self._last_pass_rate[prompt_id] = rate
        self._observations[prompt_id] = self._observations.get(prompt_id, 0) + 1
        if rate >= self.threshold:
            self._dropped.add(prompt_id)
        return prompt_id not in self._dropped

    def is_active(self, prompt_id: str) -> bool:
        """False once the prompt has been dropped; prompts never observed are active."""
        return prompt_id not in self._dropped

    def filter(self, prompt_ids: Iterable[str]) -> list[str]:
        """The active prompt ids, in the order given."""
        return [prompt_id for prompt_id in prompt_ids if prompt_id not in self._dropped]

    def last_pass_rate(self, prompt_id: str) -> float | None:
        """Pass rate of the prompt's most recent group, or None if never observed."""
        return self._last_pass_rate.get(prompt_id)

    @property
    def dropped(self) -> int:
        """How many prompts have been removed (the `curriculum_dropped_prompts` metric)."""
        return len(self._dropped)

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON/msgpack-serialisable state (str keys, floats, ints, lists)."""
        return {
            "version": STATE_VERSION,
            "threshold": self.threshold,
            "last_pass_rate": dict(self._last_pass_rate),
            "observations": dict(self._observations),
            "dropped": sorted(self._dropped),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` output. The threshold stays this object's own (the spec's);
        prompts dropped under the saved one stay dropped, removal being permanent."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise InputError(
                f"curriculum state must be a dict with version {STATE_VERSION}; "
                f"got {type(state).__name__} with version "
                f"{state.get('version') if isinstance(state, dict) else None!r}"
            )
        try:
            rates = {str(k): float(v) for k, v in state["last_pass_rate"].items()}
            counts = {str(k): int(v) for k, v in state["observations"].items()}
            dropped = {str(prompt_id) for prompt_id in state["dropped"]}
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise InputError(f"malformed curriculum state: {err!r}") from err
        if any(not 0.0 <= rate <= 1.0 for rate in rates.values()):  # also rejects NaN
            raise InputError("malformed curriculum state: a pass rate outside [0, 1]")
        self._last_pass_rate, self._observations, self._dropped = rates, counts, dropped


def union(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One state holding the records of curricula over disjoint sets of prompts."""
    merged = NoPositiveResampling()
    for state in states:
        part = NoPositiveResampling()
        part.load_state_dict(state)  # each is checked as a state of its own
        merged._last_pass_rate.update(part._last_pass_rate)
        merged._observations.update(part._observations)
        merged._dropped |= part._dropped
    return merged.state_dict()
