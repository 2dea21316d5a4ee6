"""No-Positive-Resampling: prompts at pass rate >= threshold are dropped for good."""

from __future__ import annotations

import json

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.errors import InputError
from scalerl.recipe import NoPositiveResampling, pass_rate
from scalerl.recipe.curriculum import union


def test_prompt_at_threshold_is_removed() -> None:
    curriculum = NoPositiveResampling(threshold=0.9)
    assert curriculum.observe("a", [1.0] * 9 + [-1.0]) is False  # 9/10 = 0.9 exactly
    assert curriculum.observe("b", [1.0] * 14 + [-1.0] * 2) is True  # 0.875
    assert not curriculum.is_active("a")
    assert curriculum.is_active("b")
    assert curriculum.dropped == 1


def test_removal_is_permanent_even_if_pass_rate_later_drops() -> None:
    curriculum = NoPositiveResampling()
    curriculum.observe("p", 0.95)
    assert curriculum.observe("p", 0.1) is False
    assert not curriculum.is_active("p")
    assert curriculum.last_pass_rate("p") == 0.1
    assert curriculum.dropped == 1


def test_latest_group_decides_not_the_history_average() -> None:
    curriculum = NoPositiveResampling()
    curriculum.observe("p", 0.0)
    curriculum.observe("p", 0.0)
    curriculum.observe("p", 0.9375)
    assert not curriculum.is_active("p")


def test_pass_rate_counts_positive_rewards() -> None:
    assert pass_rate([1.0, -1.0, -1.0, 1.0]) == 0.5
    assert pass_rate(torch.tensor([1.0, 1.0, 1.0, -1.0])) == 0.75
    assert pass_rate(0.3) == 0.3
    assert pass_rate(1) == 1.0


def test_filter_keeps_order_and_unseen_prompts() -> None:
    curriculum = NoPositiveResampling()
    curriculum.observe("b", 1.0)
    assert curriculum.filter(["c", "b", "a", "b"]) == ["c", "a"]


def test_state_round_trips_through_json_and_msgpack() -> None:
    curriculum = NoPositiveResampling(threshold=0.8)
    curriculum.observe("x", [1.0, 1.0, 1.0, -1.0, 1.0])
    curriculum.observe("y", 0.25)
    curriculum.observe("y", 0.5)
    state = curriculum.state_dict()
    for restored_state in (
        json.loads(json.dumps(state)),
        msgpack.unpackb(msgpack.packb(state), strict_map_key=True),
    ):
        restored = NoPositiveResampling(threshold=0.8)
        restored.load_state_dict(restored_state)
        assert restored.state_dict() == state
        assert restored.filter(["x", "y", "z"]) == ["y", "z"]
        assert restored.dropped == 1
        assert restored.last_pass_rate("y") == 0.5


def test_dropped_prompts_stay_dropped_under_a_new_threshold() -> None:
    old = NoPositiveResampling(threshold=0.5)
    old.observe("p", 0.6)
    new = NoPositiveResampling(threshold=0.9)
    new.load_state_dict(old.state_dict())
    assert new.threshold == 0.9
    assert not new.is_active("p")


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan"), True, []])
def test_bad_observations_raise_input_error(value: object) -> None:
    with pytest.raises(InputError):
        NoPositiveResampling().observe("p", value)  # type: ignore[arg-type]


@pytest.mark.parametrize("threshold", [0.0, 1.1, float("nan")])
def test_bad_threshold_raises_input_error(threshold: float) -> None:
    with pytest.raises(InputError, match="threshold"):
        NoPositiveResampling(threshold)


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"version": 1, "last_pass_rate": {}, "observations": {}},
        {"version": 1, "last_pass_rate": {"p": 3.0}, "observations": {}, "dropped": []},
        {"version": 1, "last_pass_rate": [], "observations": {}, "dropped": []},
    ],
)
def test_malformed_state_raises_input_error(state: dict) -> None:
    with pytest.raises(InputError, match="curriculum state"):
        NoPositiveResampling().load_state_dict(state)


@settings(max_examples=200, deadline=None)
@given(
    observations=st.lists(
        st.tuples(st.integers(0, 11), st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0])), max_size=40
    ),
    shards=st.integers(1, 4),
)
def test_the_union_of_shard_curricula_is_the_curriculum_of_the_whole_data(
    observations: list[tuple[int, float]], shards: int
) -> None:
    # A checkpoint written with one curriculum per generator shard resumes as one run-wide state:
    # the same as one curriculum that saw every group.
    whole = NoPositiveResampling()
    parts = [NoPositiveResampling() for _ in range(shards)]
    for prompt, rate in observations:
        whole.observe(f"p{prompt}", rate)
        parts[prompt % shards].observe(f"p{prompt}", rate)
    assert union([p.state_dict() for p in parts]) == whole.state_dict()
