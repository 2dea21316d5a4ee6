"""Supervised warm-up of a built-in base model towards a deliberately blurred policy.

RL can only sharpen what the policy already samples. The warm-up teaches the task's structure (the
demo: `</think>`, the reversed word, EOS; chat-arith: the larger number's digits, then the turn's
end) but aims each answer letter at a blurred target: the right letter with probability `1 - noise`,
a uniformly random letter of the alphabet otherwise. The model thus puts about `1 - noise + noise /
len(alphabet)` on the right letter — still the mode — and, sampled at temperature 1, writes whole
answers right only now and then (held-out pass rate ~0.1-0.25): a base policy that RL can clearly
improve.

The blur is applied in two places: the letters the model reads back are corrupted by sampling
(so it learns to carry on after its own mistakes, as it must when sampling), and the loss at each
answer position is the cross-entropy against the blurred distribution itself (its expectation,
which trains far faster than cross-entropy against sampled noisy letters).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scalerl.errors import InputError

# torch, transformers (and scalerl.generator.prompts, which imports torch through scalerl.recipe)
# are imported where a model is warmed up: `WarmupConfig` is part of the built-ins' cache keys, and
# resolving a cached built-in must not pay their ~10 s import.
if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

IGNORE = -100
Example = tuple[str, str]  # (prompt, answer)


@dataclass(frozen=True)
class WarmupConfig:
    """Hyper-parameters of the supervised warm-up; the defaults take ~30 s on 2 idle CPU cores."""

    steps: int = 500
    batch: int = 64
    lr: float = 3e-3
    warmup_steps: int = 20
    noise: float = 0.4  # probability mass moved from the right letter to uniform over the alphabet
    clean_fraction: float = 0.5  # first part of the steps trains on clean targets
    seed: int = 0


@dataclass(frozen=True)
class WarmupResult:
    losses: list[float]
    seconds: float


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor  # (B, T) context + completion (letters possibly corrupted) + end
    attention_mask: torch.Tensor  # (B, T) 1 on real tokens
    labels: torch.Tensor  # (B, T) the clean next token, IGNORE outside the completion
    blurred: torch.Tensor  # (B, T) bool: the label is an answer letter, trained towards the blur


def corrupt(answer: str, alphabet: str, noise: float, rng: random.Random) -> str:
    """`answer` with each letter of `alphabet` replaced, with probability `noise`, at random."""
    return "".join(
        rng.choice(alphabet) if c in alphabet and rng.random() < noise else c for c in answer
    )


@dataclass(frozen=True)
class Framing:
    """How a run shows a prompt to the model and what the model writes back.

    It mirrors the spec fields that decide it (`model.thinkEnd`, `data.chatTemplate`,
    `data.systemPrompt`) and encodes as the generator does, so the warm-up trains the very
    contexts the RL run samples from: raw text gets the tokenizer's BOS (if it has one); a chat
    prompt is a user turn after an optional system turn, formatted by the tokenizer's own template
    with the assistant's generation prompt.
    """

    tokenizer: PreTrainedTokenizerBase
    end_id: int  # the token the policy ends its completion with
    think_end: str | None = None  # written before the answer; None: the model does not think
    chat_template: bool = False
    system_prompt: str | None = None

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def context(self, prompt: str) -> list[int]:
        if self.chat_template:
            from scalerl.generator.prompts import chat_text

            return self.ids(chat_text(self.tokenizer, prompt, self.system_prompt))
        bos = self.tokenizer.bos_token_id
        return self.ids(prompt) if bos is None else [bos, *self.ids(prompt)]

    def completion(self, answer: str) -> list[int]:
        """What the policy should write before its end token: `thinkEnd` (if any), the answer."""
        return self.ids(answer if self.think_end is None else f"{self.think_end}{answer}")


def alphabet_ids(framing: Framing, alphabet: str) -> list[int]:
    """The single token of each letter; a letter that is not one token cannot be blurred alone."""
    ids = [framing.ids(letter) for letter in alphabet]
    split = [letter for letter, i in zip(alphabet, ids, strict=True) if len(i) != 1]
    if split:
        raise InputError(f"answer letters {split} are not single tokens of this tokenizer")
    return [i[0] for i in ids]


def _row(
    framing: Framing,
    example: Example,
    alphabet: str,
    letters: set[int],
    noise: float,
    rng: random.Random,
) -> tuple[list[int], list[int], list[int], list[bool]]:
    """(input ids, context, clean labels, blurred flags) of one example.

    Answer letters are single tokens, so the clean and corrupted completions align position by
    position; the blurred labels are the answer letters (never `thinkEnd` or the end token).
    """
    prompt, answer = example
    context = framing.context(prompt)
    clean = framing.completion(answer)
    noisy = framing.completion(corrupt(answer, alphabet, noise, rng))
    if len(noisy) != len(clean):
        raise InputError(f"answer {answer!r}: a corrupted copy tokenizes to another length")
    blur = [False] * len(context) + [t in letters for t in clean] + [False]
    return [*context, *noisy, framing.end_id], context, [*clean, framing.end_id], blur


def encode_batch(
    framing: Framing,
    examples: Sequence[Example],
    alphabet: str,
    noise: float,
    rng: random.Random,
) -> Batch:
    """Right-padded `context + completion + end` rows; labels only on the completion.

    `blurred` flags the positions whose label is an answer letter.
    """
    import torch

    letters = set(alphabet_ids(framing, alphabet))
    rows = [_row(framing, ex, alphabet, letters, noise, rng) for ex in examples]
    width = max(len(ids) for ids, *_ in rows)
    pad = framing.tokenizer.pad_token_id
    batch = Batch(
        input_ids=torch.full((len(rows), width), pad, dtype=torch.long),
        attention_mask=torch.zeros((len(rows), width), dtype=torch.long),
        labels=torch.full((len(rows), width), IGNORE, dtype=torch.long),
        blurred=torch.zeros((len(rows), width), dtype=torch.bool),
    )
    for i, (ids, context, clean, blur) in enumerate(rows):
        batch.input_ids[i, : len(ids)] = torch.tensor(ids)
        batch.attention_mask[i, : len(ids)] = 1
        batch.labels[i, len(context) : len(ids)] = torch.tensor(clean)
        batch.blurred[i, : len(blur)] = torch.tensor(blur)
    return batch


def blurred_loss(
    logits: torch.Tensor, batch: Batch, alphabet_ids: torch.Tensor, noise: float
) -> torch.Tensor:
    """Mean cross-entropy of next-token predictions against the (partly blurred) targets.

    Position t predicts token t+1, so logits are shifted against labels. At a blurred position the
    target is `(1 - noise)·onehot(right letter) + noise·uniform(alphabet)`.
    """
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    labels, blurred = batch.labels[:, 1:], batch.blurred[:, 1:]
    mask = labels != IGNORE
    hard = -logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    uniform = -logp[..., alphabet_ids].mean(-1)
    weight = noise * blurred.float()
    per_token = (1.0 - weight) * hard + weight * uniform
    return (per_token * mask).sum() / mask.sum()


def _lr_factor(step: int, config: WarmupConfig) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def warm_up(
    model: PreTrainedModel,
    framing: Framing,
    examples: Sequence[Example],
    alphabet: str,
    config: WarmupConfig = WarmupConfig(),
) -> WarmupResult:
    """Train `model` in place on `examples` towards the blurred policy; return losses and time.

    AdamW with a short linear warm-up, then cosine decay to zero: the decay lets the model settle
    on the blurred distribution instead of wherever a high learning rate last threw it.
    """
    import torch

    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    letters = torch.tensor(alphabet_ids(framing, alphabet))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config))
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(config.steps):
        # Learning the skill on clean targets first is much faster; the blur then only has to
        # flatten letter distributions the model already gets right.
        noise = config.noise if step >= config.clean_fraction * config.steps else 0.0
        chosen = [examples[rng.randrange(len(examples))] for _ in range(config.batch)]
        batch = encode_batch(framing, chosen, alphabet, noise, rng)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss = blurred_loss(logits, batch, letters, noise)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    model.eval()
    return WarmupResult(losses=losses, seconds=time.perf_counter() - start)
