"""Warm-up of `builtin:tool-arith` on whole tool conversations, and the measurement of the policy
it leaves.

scalerl.demo.warmup trains one prompt and one answer; here a row is a whole conversation (model
turns, a tool turn, game feedback) and every target is a distribution over the next token, so
that three kinds of positions train in one loss:

- the first token of a tool-arith answer: `<tool_call>` with probability `tool_rate`, else the
  first digit of a direct answer: the policy's one decision, trained to its exact probabilities
  (not to a sampled branch), so the base model calls the tool at that rate;
- a direct answer's digits: the product's digit blurred with uniform noise (scalerl.demo.warmup's
  blur), so that a direct answer is a plausible number of the right size, rarely the right one;
- a guess in guess-number: uniform over 1..N (random guessing is a fine start for RL);
- everything else the model writes (the tool call, copying the tool's result, the turn ends):
  the one right token, so the tool path is learned cleanly.

Rows are token pieces joined as the chat template joins turns (tests check the two agree).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scalerl.demo import bpe, tool_chat, tool_task
from scalerl.demo.tool_task import DIGITS, Pair

# torch and transformers are imported where a model is warmed up or sampled: `ToolWarmup` is part
# of builtin:tool-arith's cache key, and resolving the cached built-in must not pay their import.
if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class ToolWarmup:
    """The warm-up's hyper-parameters."""

    steps: int = 400
    batch: int = 40
    # At 3e-3 one warm-up seed in four never learned to copy (it has to, abruptly); 1.5e-3
    # learned it from each seed tried.
    lr: float = 1.5e-3
    warmup_steps: int = 20
    # The probability of calling the tool first that the warm-up trains towards: the sampled
    # base policy calls it somewhat less often (~0.25-0.3), being not fully trained.
    tool_rate: float = 0.35
    tool_rows: float = 0.6  # share of tool-arith rows that follow the tool path (learn it fast)
    guess_rows: float = 0.15  # share of rows that play guess-number
    noise: float = 0.5  # blur of a direct answer's digits
    seed: int = 0


Target = dict[int, float] | None  # the next-token distribution a position is trained towards


@dataclass(frozen=True)
class Row:
    ids: list[int]
    targets: list[Target]  # targets[t] is the distribution token t is drawn from; None: not trained


@dataclass(frozen=True)
class WarmupResult:
    losses: list[float]
    seconds: float


class Encoder:
    """Token pieces of the chat format, and the rows of both tasks built from them."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: ToolWarmup) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self._ids: dict[str, list[int]] = {}  # building rows tokenizes the same pieces over again
        end = tokenizer.convert_tokens_to_ids(bpe.END)  # the model's turn end: one token, one id
        assert isinstance(end, int), end
        self.end = end
        self.newline = self.ids("\n")
        self.digit = {d: self.ids(d)[0] for d in DIGITS}
        self.call_open = self.ids(tool_chat.TOOL_CALL_OPEN)[0]

    def ids(self, text: str) -> list[int]:
        if text not in self._ids:
            self._ids[text] = list(self.tokenizer(text, add_special_tokens=False).input_ids)
        return self._ids[text]

    def blur(self, digit: str) -> dict[int, float]:
        noise = self.config.noise
        dist = {self.digit[d]: noise / len(DIGITS) for d in DIGITS}
        dist[self.digit[digit]] += 1.0 - noise
        return dist

    def turn(self, row: Row, role: str, body: list[int], targets: list[Target] | None) -> None:
        """Append `<|role|>\\nbody<|end|>\\n`; the body and its `<|end|>` are trained when
        `targets` (one per body token) is given."""
        head = self.ids(f"<|{role}|>\n")
        row.ids.extend([*head, *body, self.end, *self.newline])
        trained = targets is not None
        row.targets.extend([None] * len(head))
        row.targets.extend(targets if targets is not None else [None] * len(body))
        row.targets.extend([{self.end: 1.0} if trained else None, *([None] * len(self.newline))])

    def prompt(self, row: Row, system: str, user: str) -> None:
        self.turn(row, "system", self.ids(system), None)
        self.turn(row, "user", self.ids(user), None)

    def arith(self, pair: Pair, use_tool: bool, rng: random.Random) -> Row:
        """A tool-arith conversation; its first answer token carries the tool-or-not decision."""
        row = Row([], [])
        system = f"{tool_task.SYSTEM_PROMPT}\nTools: {tool_task.TOOL_NAME}"
        self.prompt(row, system, tool_task.question(pair))
        product = str(pair[0] * pair[1])
        direct = [self.blur(product[0]), *(self.blur(d) for d in product[1:])]
        decision = {k: (1 - self.config.tool_rate) * v for k, v in direct[0].items()}
        decision[self.call_open] = self.config.tool_rate
        if not use_tool:
            noisy = "".join(
                rng.choice(DIGITS) if rng.random() < self.config.noise else d for d in product
            )
            self.turn(row, "assistant", self.ids(noisy), [decision, *direct[1:]])
            return row
        call = self.ids(
            tool_chat.tool_call_text(
                tool_task.TOOL_NAME, tool_task.call_arguments(f"{pair[0]}*{pair[1]}")
            )
        )
        self.turn(row, "assistant", call, [decision, *({t: 1.0} for t in call[1:])])
        self.turn(row, "tool", self.ids(product), None)
        answer = self.ids(product)
        self.turn(row, "assistant", answer, [{t: 1.0} for t in answer])
        return row

    def guess(self, rng: random.Random, high: int, max_turns: int) -> Row:
        """A guess-number game with uniformly random guesses, ending at the secret."""
        row = Row([], [])
        self.prompt(row, tool_task.GUESS_SYSTEM_PROMPT, tool_task.guess_prompt(high))
        uniform = {self.ids(str(g))[0]: 1.0 / high for g in range(1, high + 1)}
        secret = rng.randint(1, high)
        for turn in range(max_turns):
            guess = rng.randint(1, high)
            self.turn(row, "assistant", self.ids(str(guess)), [uniform])
            if guess == secret or turn == max_turns - 1:
                break
            self.turn(row, "user", self.ids("higher" if guess < secret else "lower"), None)
        return row


def _batch(encoder: Encoder, rows: Sequence[Row], vocab: int) -> tuple[torch.Tensor, ...]:
    """(input ids, attention mask, target distributions (B, T, V), trained mask (B, T))."""
    import torch

    width = max(len(r.ids) for r in rows)
    pad = int(encoder.tokenizer.pad_token_id)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    dist = torch.zeros((len(rows), width, vocab))
    for i, row in enumerate(rows):
        ids[i, : len(row.ids)] = torch.tensor(row.ids)
        mask[i, : len(row.ids)] = 1
        for t, target in enumerate(row.targets):
            for token, weight in (target or {}).items():
                dist[i, t, token] = weight
    return ids, mask, dist, dist.sum(-1) > 0


def soft_loss(logits: torch.Tensor, dist: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each trained token's prediction (made one position earlier)
    against its target distribution."""
    import torch

    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    per_token = -(dist[:, 1:] * logp).sum(-1)
    mask = trained[:, 1:].float()
    return (per_token * mask).sum() / mask.sum()


def _lr_factor(step: int, config: ToolWarmup) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def sample_rows(
    encoder: Encoder, pairs: Sequence[Pair], count: int, rng: random.Random
) -> list[Row]:
    config = encoder.config
    rows = []
    for _ in range(count):
        if rng.random() < config.guess_rows:
            rows.append(encoder.guess(rng, tool_task.GUESS_HIGH, max_turns=4))
        else:
            pair = pairs[rng.randrange(len(pairs))]
            rows.append(encoder.arith(pair, rng.random() < config.tool_rows, rng))
    return rows


def warm_up(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[Pair],
    config: ToolWarmup,
) -> WarmupResult:
    """Train `model` in place on conversations of both tasks; AdamW, linear warm-up, cosine
    decay to zero (as scalerl.demo.warmup)."""
    import torch

    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    encoder = Encoder(tokenizer, config)
    vocab = int(model.config.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config))
    model.train()
    losses: list[float] = []
    start = time.perf_counter()
    for _ in range(config.steps):
        ids, mask, dist, trained = _batch(
            encoder, sample_rows(encoder, pairs, config.batch, rng), vocab
        )
        loss = soft_loss(model(input_ids=ids, attention_mask=mask).logits, dist, trained)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    model.eval()
    return WarmupResult(losses=losses, seconds=time.perf_counter() - start)


@dataclass(frozen=True)
class Rates:
    tool_call_rate: float  # share of conversations whose first turn calls the tool
    pass_rate: float  # share whose final answer is the product
    prompts: int


def _sample_turn(
    model: Any,  # a causal LM: transformers types `generate` on a protocol no public class meets
    tokenizer: PreTrainedTokenizerBase,
    chats: list[list[dict[str, Any]]],
) -> list[str]:
    """One sampled model turn (temperature 1) per chat, decoded up to its turn end."""
    import torch

    tools: list[Any] = list(tool_task.tool_defs())
    contexts = [
        list(
            tokenizer.apply_chat_template(
                c, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for c in chats
    ]
    width, pad = max(len(c) for c in contexts), int(tokenizer.pad_token_id)
    input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=(input_ids != pad).long(),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=40,
            pad_token_id=pad,
        )
    ends = set(model.generation_config.eos_token_id)  # `<|end|>` and the tokenizer's EOS
    texts: list[str] = []
    for completion in out[:, width:].tolist():
        stop = next((k for k, t in enumerate(completion) if t in ends), len(completion))
        texts.append(str(tokenizer.decode(completion[:stop], skip_special_tokens=True)))
    return texts


def measure(
    model: Any,  # as in _sample_turn
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[Pair],
    seed: int,
    max_turns: int = 4,
) -> Rates:
    """Play each pair's conversation as the ToolEnv would (tool calls answered, up to
    `max_turns` model turns) with plain HF sampling; count tool calls and right answers."""
    import torch

    torch.manual_seed(seed)
    chats = [tool_task.prompt_messages(p) for p in pairs]
    final: dict[int, str] = {}
    called: set[int] = set()
    active = list(range(len(chats)))
    for turn in range(max_turns):
        if not active:
            break
        texts = _sample_turn(model, tokenizer, [chats[i] for i in active])
        still = []
        for i, text in zip(active, texts, strict=True):
            calls = tool_chat.parse_tool_calls(text)
            if calls is None:
                final[i] = text.strip()
                continue
            called |= {i} if turn == 0 else set()
            chats[i].append(_call_message(text, calls, i))
            for k, (_, arguments) in enumerate(calls):
                chats[i].append(
                    {"role": "tool", "tool_call_id": f"call_{i}_{k}", "content": _run(arguments)}
                )
            still.append(i)
        active = still
    right = sum(final.get(i) == str(a * b) for i, (a, b) in enumerate(pairs))
    return Rates(len(called) / len(pairs), right / len(pairs), len(pairs))


def _call_message(text: str, calls: list[tuple[str, str]], i: int) -> dict[str, Any]:
    before = text.split(tool_chat.TOOL_CALL_OPEN)[0]
    return {
        "role": "assistant",
        "content": before or None,
        "tool_calls": [
            {
                "id": f"call_{i}_{k}",
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
            for k, (name, args) in enumerate(calls)
        ],
    }


def _run(arguments: str) -> str:
    import json

    try:
        expression = json.loads(arguments)["expression"]
    except (ValueError, KeyError, TypeError):
        return "invalid arguments"
    return tool_task.product_tool(str(expression))
