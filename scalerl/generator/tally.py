"""What a generator counts: a prompt's samples as scored (`Group`), what a held-out prompt scored
(`score`), and the totals it reports with every evaluation (`Tally`)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from scalerl.errors import ScaleRLError
from scalerl.generator.prompts import (
    Example,
)
from scalerl.metrics import GeneratorMetrics
from scalerl.rollout.records import GeneratorStats, Sample
from scalerl.status.history import REWARD_ERROR, PromptScore, add_reasons


@dataclass
class Group:
    """A prompt's samples as scored, and the reason of each one asked for that is not among
    them (its sandbox failed, the environment failed its rollout): never trained on."""

    samples: list[Sample]
    dropped: list[str] = field(default_factory=list)


def score(example: Example, group: Group, k: int) -> PromptScore:
    """What one held-out prompt scored out of its `k` samples: passes (`Sample.passed`),
    truncations, and the samples that could not be scored (dropped, or their reward raised),
    which count as not passed."""
    if len(group.samples) + len(group.dropped) != k:
        raise ScaleRLError(
            f"prompt {example.id}: {len(group.samples)} samples and {len(group.dropped)} "
            f"dropped, but {k} were asked for"
        )
    errors = sum(bool(s.reward_error) for s in group.samples)
    reasons = add_reasons(Counter(group.dropped), {REWARD_ERROR: errors} if errors else {})
    return PromptScore(
        prompt_id=example.id,
        samples=k,
        correct=sum(s.passed for s in group.samples),
        truncated=sum(s.truncated for s in group.samples),
        domain=example.domain,
        unscored=len(group.dropped) + errors,
        unscored_reasons=reasons,
    )


@dataclass
class Tally:
    """Totals this generator reports with every evaluation (the bench's idle fraction).

    Idle time is wall time with no group being sampled at all (every producer waiting for a
    new version or for the trainer to take rollouts), not the sum of the producers' waits.
    Reward-wait time is wall time with groups in flight but none in the engine: every one of
    them waiting for its rewards (code tests), so the engine had nothing to do.
    """

    metrics: GeneratorMetrics
    sequences: int = 0
    truncated: int = 0
    tokens: int = 0
    idle_s: float = 0.0
    sync_s: float = 0.0
    score_s: float = 0.0
    send_wait_s: float = 0.0
    reward_wait_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    active: int = 0
    idle_since: float | None = field(default_factory=time.monotonic)
    generating: int = 0  # groups in the engine (the rest of `active` are being scored)
    scoring_since: float | None = None  # since when every active group is being scored
    # spec.environment's rollouts: GeneratorStats' fields of the same names.
    agent_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    environment_seconds: float = 0.0
    environment_failures: int = 0

    def begin(self) -> None:
        if self.active == 0 and self.idle_since is not None:
            seconds = time.monotonic() - self.idle_since
            self.idle_s += seconds
            self.metrics.generator_idle_seconds.inc(seconds)
            self.idle_since = None
        self.active += 1

    def end(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._reward_wait_ends()
            self.idle_since = time.monotonic()

    def generation_begins(self) -> None:
        self._reward_wait_ends()
        self.generating += 1

    def generation_ends(self) -> None:
        """A group left the engine for its rewards."""
        self.generating -= 1
        if self.generating == 0:
            self.scoring_since = time.monotonic()

    def _reward_wait_ends(self) -> None:
        if self.scoring_since is not None:
            seconds = time.monotonic() - self.scoring_since
            self.reward_wait_s += seconds
            self.metrics.generator_reward_wait_seconds.inc(seconds)
            self.scoring_since = None

    def report(self, generator: int, version: int) -> GeneratorStats:
        """The counters so far, for the trainer (`generator` at policy `version`)."""
        return GeneratorStats(
            generator=generator,
            version=version,
            generated_tokens=self.tokens,
            generated_sequences=self.sequences,
            truncated_sequences=self.truncated,
            idle_seconds=self.idle_seconds(),
            weight_sync_seconds=self.sync_s,
            uptime_seconds=time.monotonic() - self.started,
            score_seconds=self.score_s,
            send_wait_seconds=self.send_wait_s,
            reward_wait_seconds=self.reward_wait_s,
            agent_turns=self.agent_turns,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            environment_seconds=self.environment_seconds,
            environment_failures=self.environment_failures,
        )

    def idle_seconds(self) -> float:
        now = time.monotonic()
        return self.idle_s + (now - self.idle_since if self.idle_since is not None else 0.0)
