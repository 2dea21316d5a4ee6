"""build_batch: staleness, truncation and zero-variance filters, statistics, tensors, advantages."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from scalerl.errors import DataError
from scalerl.recipe import compute_advantages
from scalerl.rollout.records import RolloutGroup
from scalerl.trainer import build_batch

PAD = 0
Factory = Callable[..., RolloutGroup]


def test_stale_groups_are_dropped_and_counted(make_group: Factory) -> None:
    groups = [
        make_group([1.0, -1.0], version=2, seed=1),  # 10 - 2 = 8 behind: allowed
        make_group([1.0, -1.0], version=1, seed=2),  # 9 behind: stale
        make_group([-1.0, 1.0], version=10, seed=3),
    ]
    batch, stats = build_batch(groups, current_version=10, max_off_policy=8, pad_id=PAD)
    assert batch is not None
    assert (stats.stale_groups, stats.groups, stats.samples) == (1, 2, 4)
    assert stats.received_groups == 3 and stats.received_samples == 6
    # Lag is over the trained tokens: the stale group (version 1) was not trained on.
    assert stats.mean_lag == pytest.approx(10 - (2 + 10) / 2)


def test_policy_lag_counts_only_the_tokens_trained_on(make_group: Factory) -> None:
    kept = make_group([1.0, -1.0], version=4, seed=1)
    kept.samples[0].versions = [2, 2, 4, 4, 4]
    kept.samples[0].loss_mask = [1, 1, 0, 0, 1]  # an injected phrase is not trained on
    filtered = make_group([1.0, 1.0], version=0, seed=2)  # zero variance: dropped
    _, stats = build_batch([kept, filtered], current_version=6, max_off_policy=8, pad_id=PAD)
    trained = [2, 2, 4] + [4] * 5
    assert stats.mean_lag == pytest.approx(6 - sum(trained) / len(trained))


def test_a_tokens_lag_counts_the_oldest_weights_that_computed_it(make_group: Factory) -> None:
    """A sample begun under version 2 and continued under 4 after an in-flight update: its later
    tokens were sampled by version 4 but read the prompt and the first tokens as version 2 made
    them (the engine keeps its KV cache), so none of it is the trainer's weights alone."""
    group = make_group([1.0, -1.0], version=6, seed=1)
    group.samples[0].versions = [2, 2, 4, 4, 6]
    batch, stats = build_batch([group], current_version=6, max_off_policy=8, pad_id=PAD)
    assert batch is not None
    assert batch.lags[0].tolist() == [4, 4, 4, 4, 4]
    assert batch.lags[1].tolist() == [0, 0, 0, 0, 0]  # begun and ended under version 6
    # The policy lag counts each token's own version: below the mean of these lags.
    assert stats.mean_lag == pytest.approx(6 - (2 + 2 + 4 + 4 + 6 + 5 * 6) / 10)
    assert float(batch.lags[batch.loss_mask].float().mean()) > stats.mean_lag


def test_one_old_token_makes_a_group_stale(make_group: Factory) -> None:
    group = make_group([1.0, -1.0], version=5)
    group.samples[1].versions[0] = 0  # an in-flight sample begun under an old policy
    batch, stats = build_batch([group], current_version=5, max_off_policy=4, pad_id=PAD)
    assert batch is None and stats.stale_groups == 1


def test_no_off_policy_limit_keeps_every_group(make_group: Factory) -> None:
    groups = [make_group([1.0, -1.0], version=0, seed=1)]
    _, stats = build_batch(groups, current_version=1000, max_off_policy=None, pad_id=PAD)
    assert stats.stale_groups == 0 and stats.samples == 2


def test_truncated_samples_leave_the_batch_and_count_as_failures(make_group: Factory) -> None:
    group = make_group([1.0, 1.0, -1.0, -1.0], truncated=[True, False, False, True])
    batch, stats = build_batch([group], current_version=0, max_off_policy=None, pad_id=PAD)
    assert batch is not None
    assert stats.truncated_samples == 2 and stats.samples == 2
    assert batch.rewards.tolist() == [1.0, -1.0]
    assert stats.truncation_rate == pytest.approx(0.5)
    assert stats.pass_rate == pytest.approx(0.25)  # the truncated +1 is a failure


def test_zero_variance_groups_are_dropped_after_truncation(make_group: Factory) -> None:
    groups = [
        make_group([1.0, 1.0, 1.0], seed=1),  # all equal
        make_group([1.0, 1.0, -1.0], truncated=[False, False, True], seed=2),  # equal once cut
        make_group([-1.0, 1.0, 1.0], seed=3),  # kept
        make_group([1.0, -1.0], truncated=[True, True], seed=4),  # all truncated
    ]
    batch, stats = build_batch(groups, current_version=0, max_off_policy=None, pad_id=PAD)
    assert batch is not None
    assert stats.zero_variance_groups == 2 and stats.truncated_samples == 3
    assert (stats.groups, stats.samples) == (1, 3)
    assert batch.rewards.tolist() == [-1.0, 1.0, 1.0]


def test_zero_variance_filtering_can_be_turned_off(make_group: Factory) -> None:
    groups = [make_group([1.0, 1.0], seed=1), make_group([1.0, -1.0], seed=2)]
    batch, stats = build_batch(
        groups, current_version=0, max_off_policy=None, pad_id=PAD, drop_zero_variance=False
    )
    assert batch is not None and stats.samples == 4 and stats.zero_variance_groups == 0
    assert batch.advantages[:2].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("normalization", ["batch", "prompt", "none"])
def test_advantages_are_the_recipe_advantages_of_the_kept_samples(
    make_group: Factory, normalization: str
) -> None:
    groups = [
        make_group([1.0, -1.0, -1.0, 1.0], truncated=[False, False, False, True], seed=1),
        make_group([1.0, 1.0, 1.0], seed=2),
        make_group([-1.0, 1.0, -1.0, -1.0], seed=3),
    ]
    batch, _ = build_batch(
        groups, current_version=0, max_off_policy=None, pad_id=PAD, normalization=normalization
    )
    assert batch is not None
    assert batch.group_index.tolist() == [0, 0, 0, 1, 1, 1, 1]
    rewards = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, -1.0, -1.0])
    expected = compute_advantages(rewards, batch.group_index, normalization)
    torch.testing.assert_close(batch.advantages, expected)
    assert batch.advantages.dtype == torch.float32


def test_tensors_are_right_padded_with_positions_and_masks(make_group: Factory) -> None:
    first = make_group([1.0, -1.0], prompt_length=2, lengths=[3, 5], seed=1)
    second = make_group([-1.0, 1.0], prompt_length=4, lengths=[2, 4], seed=2)
    first.samples[1].loss_mask[2] = 0  # e.g. injected interruption tokens
    batch, stats = build_batch([first, second], current_version=0, max_off_policy=None, pad_id=PAD)
    assert batch is not None
    samples = [*first.samples, *second.samples]
    prompts = [first.prompt_ids] * 2 + [second.prompt_ids] * 2
    assert batch.input_ids.shape == (4, 5 + 4) and batch.loss_mask.shape == (4, 5)
    for row, (sample, prompt) in enumerate(zip(samples, prompts, strict=True)):
        n, total = len(sample.completion_ids), len(prompt) + len(sample.completion_ids)
        assert batch.input_ids[row, :total].tolist() == prompt + sample.completion_ids
        assert bool((batch.input_ids[row, total:] == PAD).all())
        assert batch.attention_mask[row].tolist() == [1] * total + [0] * (9 - total)
        positions = batch.completion_positions[row, :n]
        assert batch.input_ids[row, positions].tolist() == sample.completion_ids
        assert batch.loss_mask[row].tolist() == [bool(m) for m in sample.loss_mask] + [False] * (
            5 - n
        )
        torch.testing.assert_close(batch.old_logprobs[row, :n], torch.tensor(sample.logprobs))
        assert bool((batch.old_logprobs[row, n:] == 0).all())
    assert int(batch.completion_positions.max()) < batch.input_ids.shape[1]
    assert stats.tokens == batch.tokens == 3 + 4 + 2 + 4


def test_nothing_left_gives_no_batch(make_group: Factory) -> None:
    assert build_batch([], current_version=0, max_off_policy=None, pad_id=PAD)[0] is None
    groups = [make_group([1.0, 1.0], seed=1), make_group([-1.0, -1.0], seed=2)]
    batch, stats = build_batch(groups, current_version=0, max_off_policy=None, pad_id=PAD)
    assert batch is None and stats.zero_variance_groups == 2 and stats.samples == 0
    assert stats.pass_rate == pytest.approx(0.5)


def test_length_mismatch_raises_data_error(make_group: Factory) -> None:
    group = make_group([1.0, -1.0])
    group.samples[0].logprobs.pop()
    with pytest.raises(DataError, match="logprobs"):
        build_batch([group], current_version=0, max_off_policy=None, pad_id=PAD)


def test_groups_without_tokens_are_neither_stale_nor_trained(make_group: Factory) -> None:
    empty = make_group([1.0, -1.0], lengths=[0, 0], seed=1)
    batch, stats = build_batch([empty], current_version=9, max_off_policy=1, pad_id=PAD)
    assert stats.stale_groups == 0 and stats.mean_lag is None  # no token was trained on
    assert batch is not None and batch.tokens == 0 and batch.loss_mask.shape == (2, 1)


def test_a_batch_with_nothing_to_learn_says_why(make_group: Factory) -> None:
    groups = [make_group([-1.0, -1.0], seed=s) for s in range(14)]
    groups += [make_group([1.0, 1.0], seed=20 + s) for s in range(2)]
    batch, stats = build_batch(groups, current_version=0, max_off_policy=None, pad_id=PAD)
    assert batch is None
    assert stats.no_signal == "no learning signal: 14 of 16 groups all wrong, 2 all right"


def test_a_batch_with_one_mixed_group_has_signal(make_group: Factory) -> None:
    groups = [make_group([-1.0, -1.0], seed=1), make_group([1.0, -1.0], seed=2)]
    batch, stats = build_batch(groups, current_version=0, max_off_policy=None, pad_id=PAD)
    assert batch is not None and stats.no_signal is None
    assert (stats.all_wrong_groups, stats.all_right_groups) == (1, 0)
