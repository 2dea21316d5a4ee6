"""Train-inference mismatch figures: zero for an unchanged policy, the KL of a known perturbation,
each lag apart, and sums that add up over micro-batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from scalerl.recipe.mismatch import RATIO_BAND, figures, merge, mismatch_sums


def sampled(logits: torch.Tensor, seed: int) -> torch.Tensor:
    """One token per row drawn from softmax(logits)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def test_an_unchanged_policy_has_no_mismatch_in_float32() -> None:
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0))
    tokens = sampled(logits, 1)
    logprobs = logits.log_softmax(-1).gather(-1, tokens[:, None]).reshape(8, 8)
    mask = torch.ones(8, 8, dtype=torch.bool)
    lags = torch.zeros(8, 8, dtype=torch.long)

    (lag, f), *others = figures(mismatch_sums(logprobs, logprobs.clone(), mask, lags)).items()
    assert (lag, others) == (0, [])
    assert (f.kl, f.abs_mean, f.abs_max, f.outside, f.tokens) == (0.0, 0.0, 0.0, 0.0, 64)


def test_a_known_perturbation_gives_its_kl() -> None:
    """The generator samples from q = softmax(z); the trainer holds p = softmax(z + noise). The k3
    figure is the mean over the sampled tokens of (p/q - 1) - log(p/q), as numpy computes it here,
    and an unbiased estimate of the exact KL(q || p)."""
    rows, vocab = 4000, 30
    z = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    noise = 0.3 * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(3))
    q, p = z.log_softmax(-1), (z + noise).log_softmax(-1)
    tokens = sampled(z, 4)
    old = q.gather(-1, tokens[:, None]).reshape(40, 100).float()
    new = p.gather(-1, tokens[:, None]).reshape(40, 100).float()
    mask = torch.ones(40, 100, dtype=torch.bool)
    mask[:, 90:] = False  # padding: not counted
    lags = torch.zeros(40, 100, dtype=torch.long)

    f = figures(mismatch_sums(new, old, mask, lags))[0]

    delta = (new.double() - old.double())[:, :90].numpy().ravel()
    assert f.tokens == delta.size == 3600
    assert f.kl == pytest.approx(np.mean(np.exp(delta) - 1 - delta), rel=1e-9)
    assert f.abs_mean == pytest.approx(np.mean(np.abs(delta)), rel=1e-9)
    assert f.abs_max == pytest.approx(np.max(np.abs(delta)), rel=1e-12)
    low, high = RATIO_BAND
    ratio = np.exp(delta)
    assert f.outside == pytest.approx(np.mean((ratio < low) | (ratio > high)))
    exact = float((q.exp() * (q - p)).sum(-1)[:3600].mean())  # KL(q || p) of the rows counted
    spread = np.std(np.exp(delta) - 1 - delta) / math.sqrt(delta.size)
    assert abs(f.kl - exact) < 5 * spread


def test_each_lag_has_its_own_figures() -> None:
    """Tokens of lag 0 are mismatch alone; lag 1 and 2 carry the policy's movement too."""
    old = torch.zeros(3, 4)
    new = torch.tensor([[0.01, -0.01, 0.0, 0.0], [0.5, 0.5, -0.5, 0.0], [2.0, 0.0, 0.0, 0.0]])
    lags = torch.tensor([[0, 0, 0, 0], [1, 1, 1, 0], [2, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)

    by_lag = figures(mismatch_sums(new, old, mask, lags))

    assert list(by_lag) == [0, 1, 2]
    assert by_lag[0].tokens == 4 and by_lag[0].abs_max == pytest.approx(0.01)
    assert by_lag[0].outside == 0.0
    assert by_lag[1].tokens == 3 and by_lag[1].abs_mean == pytest.approx(0.5)
    assert by_lag[1].outside == 1.0  # e^0.5 and e^-0.5 both leave [0.8, 1.25]
    assert by_lag[1].kl == pytest.approx((2 * (math.exp(0.5) - 1.5) + (math.exp(-0.5) - 0.5)) / 3)
    assert by_lag[2].kl == pytest.approx(math.exp(2.0) - 3.0)


def test_a_token_the_generator_gave_no_probability_stays_finite() -> None:
    old = torch.tensor([[-math.inf, -1.0]])
    new = torch.tensor([[-1.0, -1.0]])
    f = figures(mismatch_sums(new, old, torch.ones(1, 2, dtype=torch.bool), torch.zeros(1, 2)))[0]
    assert all(math.isfinite(v) for v in (f.kl, f.abs_mean, f.abs_max))
    assert f.abs_max == 20.0 and f.outside == 0.5


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 12),
    st.integers(0, 3),
    st.integers(1, 5),
    st.integers(0, 10_000),
)
def test_micro_batches_add_up_to_the_whole(
    samples: int, tokens: int, max_lag: int, parts: int, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    new = torch.randn(samples, tokens, generator=generator)
    old = new + 0.2 * torch.randn(samples, tokens, generator=generator)
    lags = torch.randint(0, max_lag + 1, (samples, tokens), generator=generator)
    mask = torch.rand(samples, tokens, generator=generator) < 0.8
    whole = figures(mismatch_sums(new, old, mask, lags))

    rows = torch.arange(samples).tensor_split(parts)
    pieces = figures(merge(mismatch_sums(new[r], old[r], mask[r], lags[r]) for r in rows))

    assert list(pieces) == list(whole)
    for lag, f in whole.items():
        g = pieces[lag]
        assert g.tokens == f.tokens and g.abs_max == f.abs_max and g.outside == f.outside
        assert g.kl == pytest.approx(f.kl, rel=1e-9, abs=1e-15)
        assert g.abs_mean == pytest.approx(f.abs_mean, rel=1e-9)
