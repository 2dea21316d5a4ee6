"""The held-out pass rate is passed / (prompts x k), whatever could not be scored.

Each evaluation here is made of sample outcomes drawn at random: passed, failed, truncated,
scored as failed because the reward raised, or dropped because the code sandbox or the
environment failed. The pass rate, the unscored counts and the fit mark are recounted from those
outcomes alone and compared with what the generator's per-prompt score, the wire message, the
history row, the status entry and the trainer's gauges say.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.generator.main import Group, score
from scalerl.generator.prompts import Example
from scalerl.metrics import UNSCORED_GAUGES, TrainerMetrics
from scalerl.rollout.records import EvalResult, Sample, decode, encode
from scalerl.status.files import FileStatus
from scalerl.status.history import (
    MAX_UNSCORED_FRACTION,
    REWARD_ERROR,
    ROLLOUT_FAILED,
    SANDBOX,
    HeldOut,
    HistoryRow,
    PromptScore,
    read_history,
    read_scores,
)
from scalerl.status.kubernetes import status_evaluation

PASSED, FAILED, TRUNCATED = "passed", "failed", "truncated"
KEPT = (PASSED, FAILED, TRUNCATED, REWARD_ERROR)  # a sample the generator keeps
DROPPED = (SANDBOX, ROLLOUT_FAILED)  # one it could not score at all
OUTCOMES = KEPT + DROPPED


def sample(outcome: str) -> Sample:
    """A one-token sample with the reward and flags of `outcome`. A reward that raised is given
    the failure value the scorer gives it, so only the error keeps it from passing."""
    reward = 1.0 if outcome in (PASSED, TRUNCATED) else -1.0
    return Sample(
        completion_ids=[5],
        logprobs=[-0.5],
        versions=[0],
        loss_mask=[1],
        reward=1.0 if outcome == REWARD_ERROR else reward,
        truncated=outcome == TRUNCATED,
        interrupted=False,
        finish_reason="length" if outcome == TRUNCATED else "stop",
        reward_error="ValueError: judge down" if outcome == REWARD_ERROR else "",
    )


def group(outcomes: list[str]) -> Group:
    return Group(
        samples=[sample(o) for o in outcomes if o in KEPT],
        dropped=[o for o in outcomes if o in DROPPED],
    )


evaluations = st.integers(1, 6).flatmap(
    lambda k: st.lists(
        st.lists(st.sampled_from(OUTCOMES), min_size=k, max_size=k), min_size=1, max_size=12
    )
)


def recorded(per_prompt: list[list[str]]) -> list[PromptScore]:
    """The generator's scores of these outcomes, as the trainer receives them (the wire)."""
    k = len(per_prompt[0])
    examples = [Example(f"p{i}", "q", "a", domain="code") for i in range(len(per_prompt))]
    scores = [score(e, group(o), k) for e, o in zip(examples, per_prompt, strict=True)]
    message = EvalResult(step=3, version=3, generator=0, scores=scores, tokens=0)
    received = decode(encode(message))
    assert isinstance(received, EvalResult)
    return received.scores


@settings(max_examples=200, deadline=None)
@given(evaluations)
def test_the_pass_rate_is_passes_over_prompts_times_k(per_prompt: list[list[str]]) -> None:
    k = len(per_prompt[0])
    flat = [o for outcomes in per_prompt for o in outcomes]
    counts = Counter(flat)
    unscored = counts[SANDBOX] + counts[ROLLOUT_FAILED] + counts[REWARD_ERROR]
    reasons = {r: counts[r] for r in (REWARD_ERROR, ROLLOUT_FAILED, SANDBOX) if counts[r]}

    scores = recorded(per_prompt)
    for outcomes, s in zip(per_prompt, scores, strict=True):
        assert (s.samples, s.correct) == (k, outcomes.count(PASSED))
        assert s.unscored == sum(o in (*DROPPED, REWARD_ERROR) for o in outcomes)
    held = HeldOut.of(scores)
    row = evaluation_row(held, step=3, compute=1.0)
    assert row.eval_samples == len(per_prompt) * k == len(flat)
    assert row.pass_rate == counts[PASSED] / (len(per_prompt) * k)
    assert row.eval_correct == counts[PASSED]
    assert row.eval_unscored == unscored
    assert row.eval_unscored_reasons == reasons
    assert row.eval_truncation_rate == counts[TRUNCATED] / len(flat)
    too_many = unscored > MAX_UNSCORED_FRACTION * len(flat)
    assert (row.fit_excluded is not None) == too_many
    if too_many:
        assert f"{unscored} of {len(flat)} samples could not be scored" in str(row.fit_excluded)
    # The status carries the same counts and the mark the fit Job reads.
    entry = status_evaluation(row.to_dict())
    assert entry["samples"] == len(flat)
    assert entry.get("unscored", 0) == unscored
    assert entry.get("unscoredReasons", {}) == reasons
    assert ("fitExcluded" in entry) == too_many


def evaluation_row(held: HeldOut, step: int, compute: float) -> HistoryRow:
    """The history row of an evaluation alone (no training summary or counters)."""
    return HistoryRow.of(
        step=step,
        version=step,
        compute=compute,
        time=0.0,
        held_out=held,
        train=None,
        counters={},
        trainer_seconds={},
        generation={},
    )


def test_an_evaluation_with_too_many_unscored_samples_is_marked_and_says_why() -> None:
    # 8 prompts x 4: one of 4 right on each; on half the prompts the 3 others could not be
    # scored (the audit's S10, where the old count read 0.40 instead of 0.25).
    per_prompt = [[PASSED, FAILED, FAILED, FAILED]] * 4 + [[PASSED, *[SANDBOX] * 3]] * 4
    held = HeldOut.of(recorded(per_prompt))
    assert held.pass_rate == 8 / 32 == 0.25
    assert (held.samples, held.unscored, held.unscored_reasons) == (32, 12, {SANDBOX: 12})
    reason = held.fit_excluded()
    assert reason is not None and "12 of 32 samples could not be scored (sandbox 12)" in reason
    # Just under the threshold (3 of 32, 9.4 %) the evaluation is fitted.
    few = [[PASSED, FAILED, FAILED, FAILED]] * 7 + [[PASSED, SANDBOX, ROLLOUT_FAILED, SANDBOX]]
    assert HeldOut.of(recorded(few)).fit_excluded() is None


def test_the_records_of_an_evaluation_recount_to_its_history_row(tmp_path: Path) -> None:
    per_prompt = [[PASSED, REWARD_ERROR, SANDBOX], [FAILED, ROLLOUT_FAILED, PASSED]]
    scores = recorded(per_prompt)
    held = HeldOut.of(scores)
    row = evaluation_row(held, step=5, compute=0.5)
    FileStatus(tmp_path).evaluation(row, scores, [])
    [written] = read_history(tmp_path / "history.jsonl")
    again = read_scores(tmp_path, 5)
    assert again == scores
    assert written["pass_rate"] == sum(s.correct for s in again) / sum(s.samples for s in again)
    assert written["pass_rate"] == 2 / 6
    assert written["eval_unscored"] == sum(s.unscored for s in again) == 3
    assert written["eval_unscored_reasons"] == {REWARD_ERROR: 1, ROLLOUT_FAILED: 1, SANDBOX: 1}
    assert written["fit_excluded"].startswith("3 of 6 samples could not be scored")
    assert HistoryRow.from_dict(json.loads(json.dumps(written))) == row


def test_the_trainer_serves_the_unscored_counts_by_reason() -> None:
    metrics = TrainerMetrics("ns", "r")
    metrics.set_unscored(4, {SANDBOX: 3, REWARD_ERROR: 1}, excluded=True)
    served = {
        m.name: s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.labels.get("run") == "r"
    }
    assert served["scalerl_eval_unscored"] == 4
    assert served[f"scalerl_{UNSCORED_GAUGES[SANDBOX]}"] == 3
    assert served[f"scalerl_{UNSCORED_GAUGES[REWARD_ERROR]}"] == 1
    assert served[f"scalerl_{UNSCORED_GAUGES[ROLLOUT_FAILED]}"] == 0
    assert served["scalerl_eval_fit_excluded"] == 1
    with pytest.raises(ValueError, match="no gauge"):
        metrics.set_unscored(1, {"mystery": 1}, excluded=False)


@pytest.mark.parametrize(
    ("samples", "correct", "unscored", "reasons"),
    [(4, 3, 2, {SANDBOX: 2}), (4, 1, 1, {}), (4, 1, 1, {SANDBOX: 2}), (2, -1, 0, {})],
)
def test_scores_that_do_not_add_up_are_refused(
    samples: int, correct: int, unscored: int, reasons: dict[str, int]
) -> None:
    from scalerl.errors import DataError

    with pytest.raises(DataError, match="prompt 'p'"):
        PromptScore("p", samples, correct, 0, "", unscored, reasons)


def test_a_prompt_with_no_samples_is_an_error_not_left_out() -> None:
    from scalerl.errors import DataError

    scores = [PromptScore("p0", 4, 1, 0), PromptScore("p1", 0, 0, 0)]
    with pytest.raises(DataError, match="no samples"):
        HeldOut.of(scores)
