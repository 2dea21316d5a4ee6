"""A reward function that raises (a user's module:function) scores its completion as failed, with
the error, counted in reward_errors; the run goes on (audit F10 for data.reward). The mark travels
with the sample to the trainer, which counts it per step, and never lets the sample pass."""

from __future__ import annotations

import asyncio

import pytest

from scalerl.errors import InputError
from scalerl.generator.scoring import Reward, Scorer
from scalerl.metrics import GeneratorMetrics
from scalerl.rollout.records import RolloutGroup, Sample, decode, encode
from scalerl.trainer.batch import build_batch


def picky(answer: str, reference: str) -> float:
    """Exact, but it cannot judge "boom", and "data" is the data's own fault."""
    if answer == "boom":
        raise ValueError("cannot parse boom")
    if answer == "data":
        raise InputError("the reference is no test")
    return 1.0 if answer == reference else -1.0


NAME = f"{__name__}:picky"


def test_a_raising_reward_scores_the_answer_as_failed_and_counts_it() -> None:
    metrics = GeneratorMetrics("ns", "r")
    scorer = Scorer(NAME, metrics=metrics)
    pairs = [("a", "a"), ("boom", "boom"), ("b", "a"), ("boom", "x")]
    got = asyncio.run(scorer.score_all(pairs))
    error = "ValueError: cannot parse boom"
    assert got == [Reward(1.0), Reward(-1.0, error), Reward(-1.0), Reward(-1.0, error)]
    assert asyncio.run(scorer.score(pairs)) == [1.0, -1.0, -1.0, -1.0]
    total = metrics.registry.get_sample_value(
        "scalerl_reward_errors_total", {"namespace": "ns", "run": "r"}
    )
    assert total == 4  # two per call, two calls


def test_our_own_errors_still_say_what_is_wrong() -> None:
    with pytest.raises(InputError, match="the reference is no test"):
        asyncio.run(Scorer(NAME).score_all([("data", "x")]))


def sample(reward: float, error: str = "") -> Sample:
    return Sample(
        [7, 8], [-0.1, -0.2], [0, 0], [1, 1], reward, False, False, "stop", None, None, error
    )


def test_a_sample_whose_reward_raised_never_passes_and_is_counted_per_step() -> None:
    group = RolloutGroup(
        "p", [1, 2], [sample(1.0, "KeyError: judge"), sample(1.0), sample(-1.0)], 0
    )
    received = decode(encode(group))
    assert isinstance(received, RolloutGroup)
    assert [s.reward_error for s in received.samples] == ["KeyError: judge", "", ""]
    assert [s.passed for s in received.samples] == [False, True, False]
    _, stats = build_batch([received], current_version=0, max_off_policy=None, pad_id=0)
    assert stats.reward_errors == 1
    assert stats.pass_rate == 1 / 3
