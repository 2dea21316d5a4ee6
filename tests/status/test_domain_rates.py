"""An evaluation of prompts from several domains reports each domain's pass rate (with its
standard error and counts) beside the combined one: in history.jsonl, in status.evaluations, on
the trainer's /metrics, and through the generator -> trainer message that carries the scores."""

from __future__ import annotations

import math
import statistics

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest

from scalerl.metrics import TrainerMetrics
from scalerl.rollout.records import EvalResult
from scalerl.status.history import HeldOut, HistoryRow, PromptScore
from scalerl.status.kubernetes import status_evaluation

K = 4
SCORES = st.lists(
    st.tuples(st.sampled_from(["math", "code", "words"]), st.integers(0, K)),
    min_size=2,
    max_size=40,
)


def prompts(pairs: list[tuple[str, int]]) -> list[PromptScore]:
    return [PromptScore(f"p{i}", K, c, 0, d) for i, (d, c) in enumerate(pairs)]


def row_of(scores: list[PromptScore]) -> HistoryRow:
    return HistoryRow.of(
        step=10,
        version=10,
        compute=1.5,
        time=1.7e9,
        held_out=HeldOut.of(scores),
        train=None,
        counters={},
        trainer_seconds={},
        generation={},
    )


@given(SCORES)
def test_each_domains_pass_rate_is_its_own_prompts_mean(pairs: list[tuple[str, int]]) -> None:
    row = row_of(prompts(pairs)).to_dict()
    domains = sorted({d for d, _ in pairs})
    if len(domains) == 1:  # one domain: the combined pass rate is that domain's
        assert row["pass_rate_by_domain"] == {}
        return
    assert sorted(row["pass_rate_by_domain"]) == domains
    for domain in domains:
        correct = [c for d, c in pairs if d == domain]
        means = [c / K for c in correct]
        se = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else 0.0
        part = row["pass_rate_by_domain"][domain]
        assert part["pass_rate"] == sum(correct) / (K * len(correct))
        assert math.isclose(part["pass_rate_se"], se, abs_tol=1e-12)
        assert (part["prompts"], part["samples"], part["correct"]) == (
            len(correct),
            K * len(correct),
            sum(correct),
        )
    assert row["pass_rate"] == sum(c for _, c in pairs) / (K * len(pairs))


def test_the_status_carries_each_domains_pass_rate() -> None:
    scores = prompts([("math", 4), ("math", 2), ("code", 1), ("code", 0), ("code", 3)])
    entry = status_evaluation(row_of(scores).to_dict())
    assert entry["passRate"] == round(10 / 20, 6)
    code_se = statistics.stdev([0.25, 0, 0.75]) / math.sqrt(3)
    assert entry["byDomain"] == {
        "code": {"passRate": round(4 / 12, 6), "passRateSE": round(code_se, 6), "samples": 12},
        "math": {"passRate": 0.75, "passRateSE": 0.25, "samples": 8},
    }
    one = status_evaluation(row_of(prompts([("math", 4), ("math", 1)])).to_dict())
    assert "byDomain" not in one


def test_a_domain_whose_pass_rate_is_not_a_number_is_left_out_of_the_status() -> None:
    row = row_of(prompts([("math", 4), ("code", 1)])).to_dict()
    row["pass_rate_by_domain"]["code"]["pass_rate"] = float("nan")
    assert sorted(status_evaluation(row)["byDomain"]) == ["math"]


def test_the_scores_message_keeps_each_prompts_domain() -> None:
    scores = prompts([("math", 4), ("code", 1)])
    result = EvalResult(step=3, version=3, generator=0, scores=scores, tokens=9)
    assert EvalResult.from_msg(result.to_msg()).scores == scores


def test_the_trainer_serves_each_domains_pass_rate_with_a_domain_label() -> None:
    metrics = TrainerMetrics("team-a", "math-code")
    row = row_of(prompts([("math", 4), ("math", 2), ("code", 1), ("code", 0)]))
    metrics.set_domain_pass_rates(row.pass_rate_by_domain)
    text = generate_latest(metrics.registry).decode()
    labels = 'domain="{}",namespace="team-a",run="math-code"'
    assert f"scalerl_eval_domain_pass_rate{{{labels.format('math')}}} 0.75" in text
    assert f"scalerl_eval_domain_pass_rate{{{labels.format('code')}}} 0.125" in text
    assert f"scalerl_eval_domain_pass_rate_stderr{{{labels.format('code')}}} 0.125" in text
