"""Supervised warm-up of the demo's base model on deliberately noisy targets.

RL can only sharpen what the policy already samples. The warm-up teaches the task's structure
(`</think>`, then the reversed word, then EOS) but each answer letter is replaced by a random
letter with probability `noise`, drawn afresh every step. The model thus learns a per-letter
distribution whose mode is the right letter but whose mass on it is only about
`1 - noise + noise / len(alphabet)`; sampled at temperature 1, whole answers come out right only
now and then (held-out pass rate ~0.1-0.25) — a base policy that RL can clearly improve.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from scalerl.demo.tokenizer import THINK_END

IGNORE = -100


@dataclass(frozen=True)
class WarmupConfig:
    """Hyper-parameters of the supervised warm-up; the defaults take ~20 s on 2 CPU cores."""

    steps: int = 400
    batch: int = 64
    lr: float = 3e-3
    warmup_steps: int = 20
    noise: float = 0.4  # probability that each answer letter is replaced by a random letter
    seed: int = 0


@dataclass(frozen=True)
class WarmupResult:
    losses: list[float]
    seconds: float


def noisy_answer(answer: str, alphabet: str, noise: float, rng: random.Random) -> str:
    """`answer` with each letter of `alphabet` replaced, with probability `noise`, by a random one."""
    return "".join(
        rng.choice(alphabet) if c in alphabet and rng.random() < noise else c for c in answer
    )


def completion(answer: str) -> str:
    """What the policy should write: no thinking, the end-of-thinking marker, then the answer."""
    return f"{THINK_END}{answer}"


def encode_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], completions: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Right-padded `bos + prompt + completion + eos`, with labels only on the completion.

    The prompt is encoded exactly as the generator encodes it (bos + ids, no template), so the
    warm-up trains the same context the RL run samples from.
    """
    rows: list[tuple[list[int], list[int]]] = []
    for prompt, text in zip(prompts, completions, strict=True):
        context = [tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False).input_ids]
        target = [*tokenizer(text, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        rows.append((context + target, [IGNORE] * len(context) + target))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention[i, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def _schedule(config: WarmupConfig) -> torch.optim.lr_scheduler.LambdaLR:
    raise NotImplementedError  # replaced below; kept for type checkers


def warm_up(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[dict[str, str]],
    alphabet: str,
    config: WarmupConfig = WarmupConfig(),
) -> WarmupResult:
    """Train `model` in place on `examples` with noisy answers; return per-step losses and time.

    AdamW with a short linear warm-up then cosine decay to zero: the decay matters because the
    targets are noisy, and a model still moving at a high rate would land on an arbitrary
    distorted distribution instead of the noisy one we aimed for.
    """
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config))
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    for _ in range(config.steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(config.batch)]
        targets = [
            completion(noisy_answer(ex["answer"], alphabet, config.noise, rng)) for ex in batch
        ]
        inputs = encode_batch(tokenizer, [ex["prompt"] for ex in batch], targets)
        loss = model(**inputs).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    model.eval()
    return WarmupResult(losses=losses, seconds=time.perf_counter() - start)


def _lr_factor(step: int, config: WarmupConfig) -> float:
    import math

    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
