"""Mismatch corrections (recipe.correction) against a loop over the definitions: the loss and its
gradient, every loss, both levels; and which log-probabilities anchor the ratio under lag."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from scalerl.errors import InputError
from scalerl.recipe import Correction, compute_policy_loss
from scalerl.recipe.correction import correct

EPS_MAX, EPS_LOW, EPS_HIGH = 4.0, 0.2, 0.28
CORRECTIONS = [
    Correction("truncate", "token", cap=1.5),
    Correction("truncate", "sequence", cap=1.2),
    Correction("mask", "token", low=0.6, high=1.6),
    Correction("mask", "sequence", low=0.8, high=1.25),
]


def make_batch(seed: int = 0) -> dict[str, Tensor]:
    """10 samples x 7 tokens with ratios spread well beyond every bound above."""
    gen = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(10, 7, generator=gen, dtype=torch.float64)
    logprobs = old + 0.8 * torch.randn(10, 7, generator=gen, dtype=torch.float64)
    mask = torch.rand(10, 7, generator=gen) > 0.2
    mask[3] = False
    return {
        "logprobs": logprobs.requires_grad_(),
        "old_logprobs": old,
        "advantages": torch.randn(10, generator=gen, dtype=torch.float64),
        "mask": mask,
        "group_index": torch.arange(10) // 3,
    }


def reference_loss(loss: str, correction: Correction, b: dict[str, Tensor]) -> Tensor:
    """Token-mean loss, one token at a time from the definitions in scalerl.recipe.correction."""
    logp, old, adv, mask = b["logprobs"], b["old_logprobs"], b["advantages"], b["mask"]
    total = logp.new_zeros(())
    for i in range(logp.shape[0]):
        trained = [t for t in range(logp.shape[1]) if mask[i, t]]
        if not trained:
            continue
        ratios = {t: torch.exp(logp[i, t] - old[i, t]) for t in trained}
        mean_w = math.exp(sum(math.log(ratios[t].item()) for t in trained) / len(trained))
        for t in trained:  # the ratio the loss sees (truncate) and the token's weight (mask)
            w = ratios[t].item() if correction.level == "token" else mean_w
            if correction.type == "truncate" and w > correction.cap:
                ratios[t] = ratios[t] * correction.cap / w
        kept = {
            t: correction.type != "mask"
            or correction.low
            <= (ratios[t].item() if correction.level == "token" else mean_w)
            <= correction.high
            for t in trained
        }
        if loss == "gspo":
            s = torch.exp(sum(torch.log(ratios[t]) for t in trained) / len(trained))
            sample = -torch.minimum(s * adv[i], s.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * adv[i])
            total = total + sum(sample for t in trained if kept[t])
            continue
        for t in trained:
            rho = ratios[t]
            if loss == "cispo":
                token = -min(rho.item(), EPS_MAX) * adv[i] * logp[i, t]
            else:
                token = -torch.minimum(rho * adv[i], rho.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * adv[i])
            total = total + (token if kept[t] else 0.0)
    return total / int(mask.sum())


@pytest.mark.parametrize("correction", CORRECTIONS, ids=lambda c: f"{c.type}-{c.level}")
@pytest.mark.parametrize("loss", ["cispo", "dapo", "grpo", "gspo"])
def test_each_correction_gives_the_hand_computed_loss_and_gradient(
    loss: str, correction: Correction
) -> None:
    batch = make_batch()
    eps = {"epsilon_max": EPS_MAX, "epsilon_low": EPS_LOW, "epsilon_high": EPS_HIGH}
    got, stats = compute_policy_loss(
        **batch,
        loss=loss,
        aggregation="token",
        correction=correction,
        **eps,
    )
    (got_grad,) = torch.autograd.grad(got, batch["logprobs"])
    want = reference_loss(loss, correction, batch)
    (want_grad,) = torch.autograd.grad(want, batch["logprobs"])

    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-9, abs=1e-12)
    assert torch.allclose(got_grad, want_grad, rtol=1e-9, atol=1e-12)
    assert 0.05 < stats["corrected_fraction"] < 0.95  # the bounds bite, and not everywhere


def test_no_correction_is_the_loss_as_it_was() -> None:
    batch = make_batch(1)
    plain, stats = compute_policy_loss(**batch, aggregation="token")
    wide, _ = compute_policy_loss(
        **batch,
        aggregation="token",
        correction=Correction("mask", "token", low=1e-9, high=1e9),
    )
    assert float(plain.detach()) == float(wide.detach()) and stats["corrected_fraction"] == 0.0


def test_cispo_truncated_at_a_cap_is_cispo_with_that_epsilon_max() -> None:
    batch = make_batch(2)
    truncated, _ = compute_policy_loss(
        **batch,
        epsilon_max=4.0,
        correction=Correction("truncate", cap=1.5),
    )
    capped, _ = compute_policy_loss(**batch, epsilon_max=1.5)
    assert float(truncated.detach()) == pytest.approx(float(capped.detach()), rel=1e-12)


def test_under_in_flight_updates_each_token_is_anchored_at_the_version_that_sampled_it() -> None:
    """A sample whose first two tokens came from version 3 and the last two from version 4 (the
    trainer holds 4). Each token's ratio is the trainer's probability over the one its own
    version recorded, and CISPO's cap and a token truncation act on each alone."""
    trainer = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    # version 3 gave the first two tokens lower probability (the policy moved); version 4 the
    # same as the trainer's up to a small numeric mismatch.
    recorded = torch.tensor([[-3.0, -1.2, -1.01, -0.99]], dtype=torch.float64)
    advantage = torch.tensor([1.0], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    group = torch.zeros(1, dtype=torch.long)

    loss, stats = compute_policy_loss(
        trainer, recorded, advantage, mask, group, aggregation="token", epsilon_max=4.0
    )
    ratios = [math.exp(-1.0 - r) for r in (-3.0, -1.2, -1.01, -0.99)]  # e^2, e^0.2, ~1.01, ~0.99
    weights = [min(r, 4.0) for r in ratios]  # version 3's first token: e^2 = 7.39, capped at 4
    assert float(loss.detach()) == pytest.approx(sum(w * 1.0 for w in weights) / 4)  # -w * A * (-1)
    assert stats["ratio_max"] == pytest.approx(ratios[0]) and stats["clip_fraction"] == 0.25

    # A mask at [0.8, 1.25] drops the token the policy moved (and only it): a bound
    # inside the lag's spread discards what PipelineRL-k allows on purpose.
    masked, stats = compute_policy_loss(
        trainer,
        recorded,
        advantage,
        mask,
        group,
        aggregation="token",
        correction=Correction("mask", low=0.8, high=1.25),
    )
    assert float(masked.detach()) == pytest.approx(sum(weights[1:]) / 4)
    assert stats["corrected_fraction"] == 0.25


def test_a_generator_log_prob_of_minus_infinity_truncates_to_the_cap() -> None:
    trainer = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    recorded = torch.tensor([[-math.inf, -2.0]])
    out = correct(trainer, recorded, torch.ones(1, 2, dtype=torch.bool), Correction("truncate"))
    ratio = (trainer.detach() - out.old_logprobs).exp()
    assert ratio[0].tolist() == pytest.approx([2.0, 1.0])
    assert out.changed.tolist() == [[True, False]]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"type": "clip"}, "unknown correction 'clip'"),
        ({"level": "batch"}, "unknown correction level 'batch'"),
        ({"cap": 0.5}, "cap must be >= 1"),
        ({"low": 1.2}, "bounds must hold 1"),
    ],
)
def test_a_bad_correction_says_what_is_wrong(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(InputError, match=words):
        Correction(**kwargs)
