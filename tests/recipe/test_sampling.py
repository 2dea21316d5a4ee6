"""The sampling filters' log-probs: the distribution the generator records under top-p, top-k and
min-p, against a plain per-row reference written from the definition; the sampled token always
kept; the gradient through the kept logits only; nothing changed with the filters off."""

from __future__ import annotations

import math

import pytest
import torch

from scalerl.errors import InputError
from scalerl.recipe import SamplingFilters, filtered_logprobs, kept_tokens, token_entropy

SETTINGS = {
    "top-p 0.9": SamplingFilters(top_p=0.9),
    "top-p 0.3": SamplingFilters(top_p=0.3),
    "top-k 5": SamplingFilters(top_k=5),
    "top-k 1": SamplingFilters(top_k=1),
    "min-p 0.1": SamplingFilters(min_p=0.1),
    "top-k 8, top-p 0.8": SamplingFilters(top_p=0.8, top_k=8),
    "min-p 0.05, top-p 0.7": SamplingFilters(top_p=0.7, min_p=0.05),
    "all three": SamplingFilters(top_p=0.85, top_k=6, min_p=0.02),
}


def reference_kept(row: list[float], f: SamplingFilters) -> set[int]:
    """The kept tokens of one row of tempered logits, by the definition, in float64."""
    kept = set(range(len(row)))
    if f.min_p > 0:
        weights = [math.exp(v - max(row)) for v in row]  # probability / the largest probability
        kept = {i for i in kept if weights[i] >= f.min_p}
    if 0 < f.top_k < len(row) and len(kept) > f.top_k:
        kth = sorted((row[i] for i in kept), reverse=True)[f.top_k - 1]
        kept = {i for i in kept if row[i] >= kth}  # ties with the k-th all stay
    if f.top_p < 1:
        total = sum(math.exp(row[i]) for i in kept)
        mass_above = 0.0
        nucleus = set()
        for i in sorted(kept, key=lambda i: -row[i]):  # most likely first
            if mass_above < f.top_p:  # the tokens above it do not yet reach top_p
                nucleus.add(i)
            mass_above += math.exp(row[i]) / total
        kept = nucleus
    return kept


def reference_logprob(row: list[float], kept: set[int], token: int) -> float:
    support = kept | {token}
    return row[token] - math.log(sum(math.exp(row[i]) for i in support))


def reference_entropy(row: list[float], kept: set[int]) -> float:
    total = sum(math.exp(row[i]) for i in kept)
    probs = [math.exp(row[i]) / total for i in kept]
    return -sum(p * math.log(p) for p in probs if p > 0)


def some_logits(rows: int = 12, vocab: int = 40, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 2.5 * torch.randn(rows, vocab, generator=gen)


@pytest.mark.parametrize("filters", SETTINGS.values(), ids=SETTINGS.keys())
def test_logprobs_and_entropy_are_those_of_the_filtered_distribution(
    filters: SamplingFilters,
) -> None:
    logits = some_logits()
    gen = torch.Generator().manual_seed(1)
    targets = torch.multinomial(logits.softmax(-1), 1, generator=gen).squeeze(-1)
    kept = kept_tokens(logits, filters)
    logprobs, entropy = filtered_logprobs(logits.clone(), targets, filters)
    dropped_some = False
    for r, row in enumerate(logits.double().tolist()):
        expected = reference_kept(row, filters)
        assert set(kept[r].nonzero().flatten().tolist()) == expected
        dropped_some |= len(expected) < len(row)
        token = int(targets[r])
        assert logprobs[r].item() == pytest.approx(
            reference_logprob(row, expected, token), abs=1e-5
        )
        if token in expected:
            assert entropy[r].item() == pytest.approx(reference_entropy(row, expected), abs=1e-5)
    assert dropped_some, "the setting must drop tokens somewhere, or the test proves nothing"
    # Not the plain softmax: the filtered log-probs are higher wherever a token was dropped.
    plain = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    assert bool((logprobs >= plain - 1e-6).all()) and bool((logprobs > plain + 1e-3).any())


def test_top_k_keeps_every_token_tied_with_the_kth() -> None:
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0]])
    kept = kept_tokens(logits, SamplingFilters(top_k=2))
    assert kept.tolist() == [[True, False, True, True, True, False]]


def test_top_p_always_keeps_the_most_likely_token_and_min_p_one_keeps_the_ties_at_the_top() -> None:
    logits = torch.tensor([[5.0, 0.0, 1.0, 5.0 - 1e-3]])
    assert kept_tokens(logits, SamplingFilters(top_p=1e-6)).tolist() == [
        [True, False, False, False]
    ]
    tied = torch.tensor([[2.0, 2.0, 1.0]])
    assert kept_tokens(tied, SamplingFilters(min_p=1.0)).tolist() == [[True, True, False]]


def test_a_sampled_token_outside_the_kept_set_counts_as_kept() -> None:
    # Under float error the generator may have kept (and sampled) a token the trainer drops.
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0], [0.0, 2.0, 2.5, 1.0]])
    targets = torch.tensor([2, 0])  # both outside top-2
    filters = SamplingFilters(top_k=2)
    assert kept_tokens(logits, filters)[[0, 1], targets].tolist() == [False, False]
    assert kept_tokens(logits, filters, targets)[[0, 1], targets].tolist() == [True, True]
    logprobs, entropy = filtered_logprobs(logits.clone(), targets, filters)
    assert bool(torch.isfinite(logprobs).all()) and bool(torch.isfinite(entropy).all())
    for r, row in enumerate(logits.double().tolist()):
        top2 = set(sorted(range(4), key=lambda i: -row[i])[:2])
        expected = reference_logprob(row, top2, int(targets[r]))
        assert logprobs[r].item() == pytest.approx(expected, abs=1e-6)


def test_the_gradient_flows_through_the_kept_logits_only() -> None:
    logits = some_logits(rows=6, vocab=30, seed=3).requires_grad_(True)
    targets = logits.detach().argmax(-1)
    filters = SamplingFilters(top_p=0.8, top_k=10)
    logprobs, entropy = filtered_logprobs(logits * 1.0, targets, filters)
    assert not entropy.requires_grad
    logprobs.sum().backward()
    assert logits.grad is not None
    kept = kept_tokens(logits, filters, targets)
    # d log p_t / d l_i = [i = t] - p_i over the kept tokens, 0 for the dropped ones.
    probs = logits.detach().masked_fill(~kept, -math.inf).softmax(-1)
    expected = torch.nn.functional.one_hot(targets, 30).float() - probs
    torch.testing.assert_close(logits.grad, expected, atol=1e-6, rtol=0)
    assert bool((logits.grad[~kept] == 0).all()) and bool((~kept).any())


def test_filters_off_change_nothing() -> None:
    logits = some_logits()
    targets = logits.argmin(-1)
    logprobs, entropy = filtered_logprobs(logits.clone(), targets, SamplingFilters())
    plain = logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    assert torch.equal(logprobs, plain) and torch.equal(entropy, token_entropy(logits))
    # A top-k as large as the vocabulary, or larger, is off too (as in vLLM).
    assert bool(kept_tokens(logits, SamplingFilters(top_k=40)).all())
    assert bool(kept_tokens(logits, SamplingFilters(top_k=1000)).all())


def test_rows_are_filtered_in_blocks_as_if_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    logits = some_logits(rows=10)
    filters = SamplingFilters(top_p=0.6, min_p=0.01)
    whole = kept_tokens(logits, filters)
    monkeypatch.setattr("scalerl.recipe.sampling.FILTER_ROWS", 3)
    assert torch.equal(kept_tokens(logits, filters), whole)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_p": 1.5}, "top_p must be in (0, 1]"),
        ({"top_k": -1}, "top_k must be an int >= 0"),
        ({"min_p": -0.1}, "min_p must be in [0, 1]"),
        ({"min_p": 2.0}, "min_p must be in [0, 1]"),
    ],
)
def test_bad_filters_are_named(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(InputError, match=named.replace("(", r"\(").replace("[", r"\[")):
        SamplingFilters(**kwargs)  # type: ignore[arg-type]
