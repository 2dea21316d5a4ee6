"""Forced length interruption: cutoff drawn uniformly from the window; phrase masked."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from scalerl.errors import InputError
from scalerl.recipe import InterruptionPlan, completion_loss_mask, splice


def test_cutoff_is_uniform_over_window_bounds_inclusive() -> None:
    plan = InterruptionPlan(thinking_budget=20, answer_budget=5, window=(10, 14))
    rng = random.Random(0)
    counts = Counter(plan.cutoff(rng) for _ in range(5000))
    assert set(counts) == {10, 11, 12, 13, 14}
    assert all(abs(count - 1000) < 150 for count in counts.values())


def test_paper_window_stays_within_thinking_budget() -> None:
    plan = InterruptionPlan(thinking_budget=12288, answer_budget=2048, window=(10240, 12288))
    rng = random.Random(1)
    draws = [plan.cutoff(rng) for _ in range(2000)]
    assert min(draws) >= 10240 and max(draws) <= 12288


def test_same_seed_gives_same_cutoffs() -> None:
    plan = InterruptionPlan(thinking_budget=100, answer_budget=10, window=(50, 100))
    first = [plan.cutoff(random.Random(7)) for _ in range(3)]
    assert first == [plan.cutoff(random.Random(7)) for _ in range(3)]


def test_disabled_plan_cuts_at_thinking_budget() -> None:
    plan = InterruptionPlan(thinking_budget=300, answer_budget=10, window=(100, 200), enabled=False)
    assert {plan.cutoff(random.Random(seed)) for seed in range(20)} == {300}


@pytest.mark.parametrize(
    ("window", "budget"),
    [((0, 10), 20), ((15, 10), 20), ((10, 25), 20), ((-5, 5), 20)],
)
def test_bad_window_raises_input_error(window: tuple[int, int], budget: int) -> None:
    with pytest.raises(InputError, match="window"):
        InterruptionPlan(thinking_budget=budget, answer_budget=5, window=window)


def test_bad_budgets_raise_input_error() -> None:
    with pytest.raises(InputError, match="thinking_budget"):
        InterruptionPlan(thinking_budget=0, answer_budget=5, window=(1, 1))
    with pytest.raises(InputError, match="answer_budget"):
        InterruptionPlan(thinking_budget=10, answer_budget=0, window=(1, 1))


def test_splice_masks_the_injected_phrase() -> None:
    ids, mask = splice([11, 12, 13], [901, 902])
    assert ids == [11, 12, 13, 901, 902]
    assert mask == [1, 1, 1, 0, 0]


def test_completion_mask_trains_thinking_and_answer_only() -> None:
    assert completion_loss_mask(2, 3, 2) == [1, 1, 0, 0, 0, 1, 1]
    assert completion_loss_mask(0, 0, 0) == []
    with pytest.raises(InputError):
        completion_loss_mask(1, -1, 0)
