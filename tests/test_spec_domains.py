"""Several domains in one run: `data.train` (and `data.validation.path`) as one file or a list of
sources, each with its reward and domain; the defaults filled in once, and a bad entry named by
its path."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalerl.errors import SpecError
from scalerl.spec import MAX_DOMAINS, default_domain, parse_run

RUN: dict[str, Any] = {
    "apiVersion": "scalerl.dev/v1alpha1",
    "kind": "ScaleRLRun",
    "metadata": {"name": "math-code"},
    "spec": {"model": {"path": "/models/base"}, "data": {"train": "/data/train.jsonl"}},
}
REWARDS = st.sampled_from(["math", "exact", "code", "my_rewards:score_words"])
DOMAINS = st.from_regex(r"\A[a-z0-9]([a-z0-9_.-]{0,6}[a-z0-9])?\Z")
SOURCES = st.lists(
    st.fixed_dictionaries(
        {"path": st.from_regex(r"\A/data/[a-z]{1,8}\.jsonl\Z")},
        optional={"reward": REWARDS, "domain": DOMAINS},
    ),
    min_size=1,
    max_size=5,
)


def _run(**data: Any) -> dict[str, Any]:
    run = copy.deepcopy(RUN)
    run["spec"]["data"].update(data)
    return run


def test_a_file_named_alone_takes_the_runs_reward_and_its_name_as_domain() -> None:
    data = parse_run(_run(reward="exact")).spec.data
    (source,) = data.train_sources()
    assert (source.path, source.reward, source.domain) == ("/data/train.jsonl", "exact", None)
    assert data.held_out() == [] and data.rewards() == ["exact"]


@given(SOURCES, SOURCES, REWARDS)
def test_sources_keep_their_order_and_fill_in_the_runs_reward(
    train: list[dict[str, str]], validation: list[dict[str, str]], reward: str
) -> None:
    data = parse_run(
        _run(train=train, validation={"path": validation, "prompts": 10}, reward=reward)
    ).spec.data
    for given_sources, parsed in ((train, data.train_sources()), (validation, data.held_out())):
        assert [s.path for s in parsed] == [s["path"] for s in given_sources]
        assert [s.reward for s in parsed] == [s.get("reward", reward) for s in given_sources]
        assert [s.domain for s in parsed] == [s.get("domain") for s in given_sources]
    expected = [s.get("reward", reward) for s in train + validation]
    assert data.rewards() == list(dict.fromkeys(expected))
    # What the spec reads back is what it was given: the CRD stores this form.
    again = parse_run(_run(**parse_run(_run(train=train)).spec.data.model_dump(by_alias=True)))
    assert again.spec.data.train_sources() == parse_run(_run(train=train)).spec.data.train_sources()


@given(
    st.sampled_from(
        [
            ({"path": "/d.jsonl", "reward": "bogus"}, "0.reward", "not one of math"),
            ({"path": "/d.jsonl", "domain": "Math Problems"}, "0.domain", "not a domain name"),
            ({"path": ""}, "0.path", "at least 1 character"),
            ({"reward": "math"}, "0.path", "required field is missing"),
            ({"path": "/d.jsonl", "weight": 2}, "0.weight", "unknown field"),
        ]
    ),
    st.integers(0, 3),
)
def test_a_bad_source_is_named_by_its_path(bad: tuple[dict, str, str], before: int) -> None:
    entry, where, why = bad
    sources = [{"path": f"/data/{i}.jsonl"} for i in range(before)] + [entry]
    at = where.replace("0.", f"{before}.", 1)
    for field, run in (
        ("spec.data.train", _run(train=sources)),
        ("spec.data.validation.path", _run(validation={"path": sources})),
    ):
        with pytest.raises(SpecError) as info:
            parse_run(run)
        (problem,) = info.value.problems
        assert problem.startswith(f"{field}.{at}: ") and why in problem, problem


@pytest.mark.parametrize("value", [5, {"path": "/d.jsonl"}, [], ""])
def test_train_that_is_neither_a_file_nor_sources_is_refused_in_one_line(value: object) -> None:
    with pytest.raises(SpecError) as info:
        parse_run(_run(train=value))
    (problem,) = info.value.problems
    assert problem.startswith("spec.data.train: "), problem


def test_more_domains_than_status_holds_are_refused() -> None:
    many = [{"path": f"/d{i}.jsonl", "domain": f"d{i}"} for i in range(MAX_DOMAINS + 1)]
    with pytest.raises(SpecError) as info:
        parse_run(_run(train=many))
    assert info.value.problems == [f"spec.data.train: {MAX_DOMAINS + 1} domains, more than 8"]
    parse_run(_run(train=many[:MAX_DOMAINS]))


def test_the_default_domain_is_the_rewards_name() -> None:
    assert [default_domain(r) for r in ("math", "exact", "code")] == ["math", "exact", "code"]
    assert default_domain("my_rewards:score_words") == "score_words"
    assert default_domain("pkg.mod:Judge.Score") == "score"
