"""Token entropy: float32, stable for large and -inf logits, equal to -sum p log p."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.recipe import token_entropy


def test_entropy_matches_loop_definition() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 3, 7, generator=gen)
    result = token_entropy(logits)
    assert result.shape == (2, 3)
    for index in torch.cartesian_prod(torch.arange(2), torch.arange(3)).tolist():
        row = logits[index[0], index[1]].double()
        probs = [math.exp(v) / sum(math.exp(w) for w in row.tolist()) for v in row.tolist()]
        expected = -sum(p * math.log(p) for p in probs)
        assert result[index[0], index[1]].item() == pytest.approx(expected, abs=1e-5)


def test_uniform_logits_give_log_vocab() -> None:
    assert token_entropy(torch.zeros(4, 50)).tolist() == pytest.approx([math.log(50)] * 4)


def test_one_hot_and_masked_vocab_give_finite_values() -> None:
    logits = torch.tensor([[0.0, -math.inf, -math.inf], [1e4, 0.0, -1e4]])
    result = token_entropy(logits)
    assert torch.isfinite(result).all()
    assert result.tolist() == pytest.approx([0.0, 0.0], abs=1e-6)


def test_bfloat16_logits_are_computed_in_float32() -> None:
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(1))
    result = token_entropy(logits.bfloat16())
    assert result.dtype == torch.float32
    torch.testing.assert_close(result, token_entropy(logits.bfloat16().float()))
