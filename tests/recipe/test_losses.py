"""Policy losses against direct, loop-based re-implementations of the paper's formulas."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from scalerl.errors import InputError
from scalerl.recipe import LOSSES, compute_policy_loss

EPS_MAX, EPS_LOW, EPS_HIGH = 4.0, 0.2, 0.28
LOSS_NAMES = ["cispo", "dapo", "grpo", "gspo"]
AGGREGATIONS = ["sample", "prompt", "token"]


def make_batch(dtype: torch.dtype = torch.float64, seed: int = 0) -> dict[str, Tensor]:
    """12 samples x 9 tokens: ragged masks with holes, one empty sample, one one-sample group."""
    gen = torch.Generator().manual_seed(seed)
    samples, tokens = 12, 9
    old = -3 * torch.rand(samples, tokens, generator=gen, dtype=torch.float64)
    logprobs = old + torch.randn(samples, tokens, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, tokens + 1, (samples,), generator=gen)
    mask = torch.arange(tokens)[None, :] < lengths[:, None]
    mask &= torch.rand(samples, tokens, generator=gen) > 0.15
    mask[4] = False  # a sample with no trained token
    return {
        "logprobs": logprobs.to(dtype).requires_grad_(),
        "old_logprobs": old.to(dtype),
        "advantages": torch.randn(samples, generator=gen, dtype=torch.float64).to(dtype),
        "mask": mask,
        # Arbitrary ids, not contiguous; id 5 is a one-sample group, id 9 has only sample 4.
        "group_index": torch.tensor([7, 7, 7, -3, 9, 42, 42, 42, 42, 5, 100, 100]),
    }


def reference_token_losses(loss: str, batch: dict[str, Tensor]) -> list[dict[int, Tensor]]:
    """Per sample, {token: loss} for its trained tokens, straight from the paper's formulas."""
    logp, old, adv, mask = (batch[k] for k in ("logprobs", "old_logprobs", "advantages", "mask"))
    rows: list[dict[int, Tensor]] = []
    for i in range(logp.shape[0]):
        trained = [t for t in range(logp.shape[1]) if mask[i, t]]
        row: dict[int, Tensor] = {}
        if loss == "gspo" and trained:
            s = torch.exp(sum(logp[i, t] - old[i, t] for t in trained) / len(trained))
            clipped = torch.clamp(s, 1 - EPS_LOW, 1 + EPS_HIGH)
            sample_loss = -min(s * adv[i], clipped * adv[i])
            row = dict.fromkeys(trained, sample_loss)
        for t in trained if loss != "gspo" else []:
            rho = torch.exp(logp[i, t] - old[i, t])
            if loss == "cispo":
                row[t] = -min(rho.item(), EPS_MAX) * adv[i] * logp[i, t]
            else:
                clipped = torch.clamp(rho, 1 - EPS_LOW, 1 + EPS_HIGH)
                row[t] = -min(rho * adv[i], clipped * adv[i])
        rows.append(row)
    return rows


def reference_aggregate(rows: list[dict[int, Tensor]], groups: list[int], mode: str) -> Tensor:
    zero = torch.zeros((), dtype=torch.float64)
    if mode == "token":
        count = sum(len(row) for row in rows)
        return sum((sum(row.values(), zero) for row in rows), zero) / max(count, 1)
    if mode == "sample":
        means = [sum(row.values(), zero) / len(row) for row in rows if row]
        return sum(means, zero) / max(len(means), 1)
    totals: dict[int, list] = {}
    for row, group in zip(rows, groups, strict=True):
        entry = totals.setdefault(group, [zero, 0])
        entry[0] = entry[0] + sum(row.values(), zero)
        entry[1] += len(row)
    means = [total / count for total, count in totals.values() if count]
    return sum(means, zero) / max(len(means), 1)


def run(batch: dict[str, Tensor], loss: str, aggregation: str) -> tuple[Tensor, dict[str, float]]:
    return compute_policy_loss(
        **batch,
        loss=loss,
        aggregation=aggregation,
        epsilon_max=EPS_MAX,
        epsilon_low=EPS_LOW,
        epsilon_high=EPS_HIGH,
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_loss_matches_paper_formula_in_value_and_gradient(
    loss: str, aggregation: str, dtype: torch.dtype
) -> None:
    batch = make_batch(dtype)
    value, _ = run(batch, loss, aggregation)
    (grad,) = torch.autograd.grad(value, batch["logprobs"])

    reference_batch = {k: v.detach().double() for k, v in batch.items() if k != "group_index"}
    reference_batch["mask"] = batch["mask"]
    reference_batch["logprobs"].requires_grad_()
    rows = reference_token_losses(loss, reference_batch)
    expected = reference_aggregate(rows, batch["group_index"].tolist(), aggregation)
    (expected_grad,) = torch.autograd.grad(expected, reference_batch["logprobs"])

    assert value.dtype == dtype
    torch.testing.assert_close(value.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad.double(), expected_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_test_batch_exercises_both_sides_of_every_clip(loss: str) -> None:
    # Guards the comparison above: with no clipping (or only clipping) it would prove little.
    _, stats = run(make_batch(), loss, "token")
    assert 0.0 < stats["clip_fraction"] < 1.0


def test_cispo_gradient_is_minus_capped_ratio_times_advantage_over_tokens() -> None:
    batch = make_batch()
    value, _ = run(batch, "cispo", "token")
    (grad,) = torch.autograd.grad(value, batch["logprobs"])
    ratio = torch.exp(batch["logprobs"].detach() - batch["old_logprobs"])
    tokens = batch["mask"].sum()
    expected = -ratio.clamp(max=EPS_MAX) * batch["advantages"][:, None] / tokens
    expected = torch.where(batch["mask"], expected, 0.0)
    torch.testing.assert_close(grad, expected, atol=1e-12, rtol=1e-12)


def one_token_batch(log_ratio: list[float], advantages: list[float]) -> dict[str, Tensor]:
    old = torch.full((len(log_ratio), 1), -1.0, dtype=torch.float64)
    return {
        "logprobs": (old + torch.tensor(log_ratio, dtype=torch.float64)[:, None]).requires_grad_(),
        "old_logprobs": old,
        "advantages": torch.tensor(advantages, dtype=torch.float64),
        "mask": torch.ones(len(log_ratio), 1, dtype=torch.bool),
        "group_index": torch.arange(len(log_ratio)),
    }


def test_cispo_caps_ratio_at_epsilon_max() -> None:
    # ρ = e^5 ≈ 148 is capped to ε_max = 4; ρ = e^-5 is not clipped from below.
    batch = one_token_batch([5.0, -5.0], [1.0, 1.0])
    value, stats = run(batch, "cispo", "sample")
    (grad,) = torch.autograd.grad(value, batch["logprobs"])
    torch.testing.assert_close(grad[:, 0], torch.tensor([-EPS_MAX, -math.exp(-5.0)]).double() / 2)
    assert stats["clip_fraction"] == 0.5
    assert stats["ratio_max"] == pytest.approx(math.exp(5.0))


def test_cispo_gradient_flows_only_through_logprobs() -> None:
    batch = one_token_batch([0.3], [2.0])
    batch["old_logprobs"].requires_grad_()
    value, _ = run(batch, "cispo", "token")
    grad_logp, grad_old = torch.autograd.grad(
        value, [batch["logprobs"], batch["old_logprobs"]], allow_unused=True
    )
    # d/dlogπ of −sg(ρ)·Â·logπ is −ρ·Â: no ρ·logπ term from differentiating ρ.
    torch.testing.assert_close(grad_logp, torch.tensor([[-math.exp(0.3) * 2.0]]).double())
    assert grad_old is None or torch.count_nonzero(grad_old) == 0


@pytest.mark.parametrize("loss", ["dapo", "grpo"])
def test_dapo_clips_ratio_only_where_it_would_grow_the_update(loss: str) -> None:
    # Â > 0: ρ above 1+ε_high is clipped (no gradient), ρ below 1−ε_low is not.
    # Â < 0: ρ below 1−ε_low is clipped, ρ above 1+ε_high is not.
    log_ratio = [math.log(1.5), math.log(0.5), math.log(0.5), math.log(1.5)]
    batch = one_token_batch(log_ratio, [1.0, 1.0, -1.0, -1.0])
    value, stats = run(batch, loss, "token")
    (grad,) = torch.autograd.grad(value, batch["logprobs"])
    expected = torch.tensor([0.0, -0.5, 0.0, 1.5], dtype=torch.float64) / 4
    torch.testing.assert_close(grad[:, 0], expected)
    expected_value = -(1.28 * 1 + 0.5 * 1 + 0.8 * -1 + 1.5 * -1) / 4
    assert value.item() == pytest.approx(expected_value)
    assert stats["clip_fraction"] == 0.5


def test_gspo_uses_the_sequence_ratio_not_token_ratios() -> None:
    # Token ratios e^{±1} would each be clipped; their geometric mean is exactly 1 (unclipped).
    old = torch.full((1, 3), -2.0, dtype=torch.float64)
    batch = {
        "logprobs": (old + torch.tensor([[1.0, -1.0, 7.0]])).requires_grad_(),
        "old_logprobs": old,
        "advantages": torch.tensor([0.5], dtype=torch.float64),
        "mask": torch.tensor([[True, True, False]]),
        "group_index": torch.tensor([0]),
    }
    value, stats = run(batch, "gspo", "sample")
    (grad,) = torch.autograd.grad(value, batch["logprobs"])
    assert value.item() == pytest.approx(-0.5)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_fraction"] == 0.0
    # ∂(−s·Â)/∂logπ_t = −s·Â/|y| for each trained token.
    torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.25, 0.0]], dtype=torch.float64))


def test_gspo_clips_the_sequence_ratio() -> None:
    batch = one_token_batch([math.log(2.0)], [1.0])
    value, stats = run(batch, "gspo", "sample")
    (grad,) = torch.autograd.grad(value, batch["logprobs"])
    assert value.item() == pytest.approx(-(1 + EPS_HIGH))
    assert grad.abs().max().item() == 0.0
    assert stats["clip_fraction"] == 1.0


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_fully_masked_batch_gives_zero_loss_connected_to_graph(loss: str, aggregation: str) -> None:
    batch = make_batch()
    batch["mask"] = torch.zeros_like(batch["mask"])
    value, stats = run(batch, loss, aggregation)
    assert value.item() == 0.0
    assert value.requires_grad
    (grad,) = torch.autograd.grad(value, batch["logprobs"])
    assert torch.count_nonzero(grad) == 0
    assert stats == dict.fromkeys(stats, 0.0)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_padding_with_infinities_changes_nothing(loss: str, aggregation: str) -> None:
    batch = make_batch()
    clean, clean_stats = run(batch, loss, aggregation)
    (clean_grad,) = torch.autograd.grad(clean, batch["logprobs"])
    padded = dict(batch)
    padded["logprobs"] = batch["logprobs"].detach().masked_fill(~batch["mask"], -math.inf)
    padded["logprobs"].requires_grad_()
    padded["old_logprobs"] = batch["old_logprobs"].masked_fill(~batch["mask"], -math.inf)
    value, stats = run(padded, loss, aggregation)
    (grad,) = torch.autograd.grad(value, padded["logprobs"])
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(value, clean)
    torch.testing.assert_close(grad, clean_grad)
    assert stats == pytest.approx(clean_stats)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_zero_advantages_everywhere_give_finite_zero_loss(loss: str, aggregation: str) -> None:
    # Every group zero-variance: all advantages 0, so loss and gradient are exactly 0.
    batch = make_batch()
    batch["advantages"] = torch.zeros_like(batch["advantages"])
    value, _ = run(batch, loss, aggregation)
    (grad,) = torch.autograd.grad(value, batch["logprobs"])
    assert value.item() == 0.0
    assert torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_float_mask_equals_bool_mask(loss: str) -> None:
    batch = make_batch()
    expected, expected_stats = run(batch, loss, "prompt")
    value, stats = run({**batch, "mask": batch["mask"].double()}, loss, "prompt")
    torch.testing.assert_close(value, expected)
    assert stats == expected_stats


def test_stats_describe_the_ratios_of_trained_tokens() -> None:
    batch = make_batch()
    _, stats = run(batch, "dapo", "prompt")
    mask = batch["mask"]
    ratio = torch.exp(batch["logprobs"].detach() - batch["old_logprobs"])[mask]
    adv = batch["advantages"][:, None].expand_as(mask)[mask]
    clipped = ((ratio > 1 + EPS_HIGH) & (adv > 0)) | ((ratio < 1 - EPS_LOW) & (adv < 0))
    assert stats["tokens"] == mask.sum().item()
    assert stats["ratio_mean"] == pytest.approx(ratio.mean().item())
    assert stats["ratio_max"] == pytest.approx(ratio.max().item())
    assert stats["ratio_min"] == pytest.approx(ratio.min().item())
    assert stats["clip_fraction"] == pytest.approx(clipped.double().mean().item())


def test_each_registered_loss_is_a_plain_function() -> None:
    assert set(LOSSES) == set(LOSS_NAMES)
    assert LOSSES["dapo"] is LOSSES["grpo"]  # same surrogate; only the caller's ε differ


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss": "ppo"}, "unknown loss 'ppo'"),
        ({"aggregation": "batch"}, "unknown loss aggregation 'batch'"),
        ({"epsilon_max": 0.0}, "epsilon_max"),
        ({"epsilon_low": 1.0}, "epsilon_low"),
        ({"epsilon_high": -0.1}, "epsilon_high"),
    ],
)
def test_bad_choices_raise_input_error_naming_them(kwargs: dict, message: str) -> None:
    batch = make_batch()
    with pytest.raises(InputError, match=message):
        compute_policy_loss(**batch, **kwargs)


def test_mismatched_shapes_raise_input_error() -> None:
    batch = make_batch()
    with pytest.raises(InputError, match=r"\[samples, tokens\]"):
        compute_policy_loss(**{**batch, "mask": batch["mask"][:, :-1]})
    with pytest.raises(InputError, match=r"\[samples\]"):
        compute_policy_loss(**{**batch, "advantages": batch["advantages"][:-1]})
