"""The supervised warm-up: batches line up, the loss aims at the blurred letter distribution."""

from __future__ import annotations

import random

import torch

from scalerl.demo.tokenizer import THINK_END, build_tokenizer
from scalerl.demo.warmup import IGNORE, Framing, blurred_loss, corrupt, encode_batch

ALPHABET = "abcdefgh"


def test_corrupt_keeps_length_and_non_alphabet_characters() -> None:
    rng = random.Random(0)
    assert corrupt("abc", ALPHABET, 0.0, rng) == "abc"
    noisy = [corrupt("ab-cd", ALPHABET, 1.0, rng) for _ in range(200)]
    assert all(len(n) == 5 and n[2] == "-" for n in noisy)
    assert len({n[0] for n in noisy}) == len(ALPHABET)


def demo_framing() -> Framing:
    tokenizer = build_tokenizer()
    return Framing(tokenizer, tokenizer.eos_token_id, think_end=THINK_END)


def test_encode_batch_labels_only_the_clean_completion() -> None:
    framing = demo_framing()
    tokenizer = framing.tokenizer
    examples = [("reverse: abc", "cba"), ("reverse: ab", "ba")]
    batch = encode_batch(framing, examples, ALPHABET, 1.0, random.Random(0))
    row = batch.input_ids[0].tolist()
    assert row[0] == tokenizer.bos_token_id
    assert tokenizer.decode(row[1:13]) == "reverse: abc"
    labels = [t for t in batch.labels[0].tolist() if t != IGNORE]
    assert tokenizer.decode(labels) == "</think>cba</s>"
    # The blurred positions are exactly the answer letters' labels.
    blurred_labels = batch.labels[0][batch.blurred[0]].tolist()
    assert tokenizer.decode(blurred_labels) == "cba"
    assert batch.attention_mask[1].sum() == len(row) - 2  # two letters shorter, right-padded
    assert batch.labels[1, -1] == IGNORE


def test_blurred_loss_is_minimal_at_the_blurred_distribution() -> None:
    framing = demo_framing()
    tokenizer = framing.tokenizer
    batch = encode_batch(framing, [("reverse: abc", "cba")], ALPHABET, 0.0, random.Random(0))
    alphabet_ids = torch.tensor(tokenizer.convert_tokens_to_ids(list(ALPHABET)))
    noise, vocab = 0.4, len(tokenizer)

    def loss_for(mass_on_right: float) -> float:
        logits = torch.full((1, batch.input_ids.shape[1], vocab), -30.0)
        for t in range(batch.input_ids.shape[1] - 1):
            label = int(batch.labels[0, t + 1])
            if label == IGNORE:
                continue
            if batch.blurred[0, t + 1]:
                probs = torch.full((len(ALPHABET),), (1 - mass_on_right) / (len(ALPHABET) - 1))
                probs[(alphabet_ids == label).nonzero()] = mass_on_right
                logits[0, t, alphabet_ids] = probs.log()
            else:
                logits[0, t, label] = 30.0
        return float(blurred_loss(logits, batch, alphabet_ids, noise))

    target = 1 - noise + noise / len(ALPHABET)
    assert loss_for(target) < loss_for(target + 0.1)
    assert loss_for(target) < loss_for(target - 0.1)
