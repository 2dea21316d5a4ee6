"""One optimizer step: forward, recipe loss, backward (optionally in micro-batches), clip, step.

**Micro-batches give the full-batch gradient exactly.** Each micro-batch is aggregated by the
recipe with the run's mode, and its loss is weighted by its share of the mode's units, so the sum
equals the full-batch loss: ``token`` — its trained tokens over all; ``sample`` — its samples that
have trained tokens over all such; ``prompt`` — its prompts' share over all prompts with trained
tokens. For ``prompt`` a micro-batch holds either whole groups or a piece of a single group (a group
larger than ``micro_batch_samples`` is split alone); a piece counts as the fraction of its group's
tokens it holds, which is exact because the group's loss is a token-weighted sum.

**Ranks.** With sharded trainer ranks (scalerl.trainer.shard) every rank holds the whole batch
and runs every world-th micro-batch; FSDP reduces the gradients, so the step is the full-batch
step whatever the number of ranks. Totals (loss, entropy, statistics) are summed over ranks.

**NaN guard.** If a loss or the gradient norm is not finite, the gradients are dropped and neither
the optimizer nor the scheduler steps: parameters, optimizer state and lr are unchanged and the
caller gets ``StepResult(skipped=True, reason=...)`` to count and log. A batch without a single
trained token is skipped the same way (an AdamW step would still apply weight decay).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from scalerl.errors import InputError
from scalerl.recipe import AggregationMode, LossName, compute_policy_loss
from scalerl.recipe.aggregation import dense_groups, group_sums
from scalerl.recipe.correction import Correction
from scalerl.recipe.losses import NO_CORRECTION
from scalerl.recipe.mismatch import LagFigures, LagSums, figures, merge, mismatch_sums
from scalerl.trainer.batch import Batch
from scalerl.trainer.policy import Policy


@dataclass(frozen=True)
class StepResult:
    """What one call of `train_step` did; ``skipped`` steps changed nothing."""

    loss: float
    entropy: float  # mean token entropy over trained tokens (nats)
    grad_norm: float  # total norm before clipping
    lr: float  # learning rate this step used (or would have used, if skipped)
    tokens: int  # trained tokens
    samples: int
    seconds: float
    stats: dict[str, float] = field(default_factory=dict)  # the recipe's ratio/clip statistics
    # Train-inference mismatch per policy lag (scalerl.recipe.mismatch), over trained tokens.
    mismatch: dict[int, LagFigures] = field(default_factory=dict)
    optimizer_seconds: float = 0.0  # of `seconds`: clipping, the optimizer and the schedule
    skipped: bool = False
    reason: str = ""


@dataclass(frozen=True)
class StepSettings:
    """The recipe's choices for one optimizer step (every trainer rank steps with the same).

    Micro-batches hold at most ``micro_batch_samples`` samples or ``micro_batch_tokens`` tokens
    (prompt + completion); ``packed`` runs each as one row without padding.
    """

    loss: LossName
    aggregation: AggregationMode
    epsilon_max: float
    epsilon_low: float
    epsilon_high: float
    max_grad_norm: float | None = None
    micro_batch_samples: int | None = None
    micro_batch_tokens: int | None = None
    packed: bool = False
    correction: Correction = NO_CORRECTION


def train_step(
    policy: Policy,
    optimizer: Optimizer,
    scheduler: LRScheduler,
    batch: Batch,
    settings: StepSettings,
) -> StepResult:
    """Take one optimizer step on ``batch`` (or skip it, see the NaN guard)."""
    started = time.perf_counter()
    rank, ranks = _world()
    lr = float(optimizer.param_groups[0]["lr"])
    optimizer.zero_grad(set_to_none=True)
    batch = batch.to(policy.device)
    if batch.tokens == 0:  # AdamW would still decay the weights: nothing to learn, no step
        return _skip(optimizer, batch, lr, started, "no trained tokens in the batch", _Totals())
    aggregation = settings.aggregation
    parts = plan_micro_batches(
        batch, settings.micro_batch_samples, aggregation, settings.micro_batch_tokens
    )
    weights = micro_batch_weights(batch, parts, aggregation)
    totals = _Totals()
    finite = True
    for rows, weight in my_share(parts, weights, rank, ranks):
        # Every part is run even after a non-finite loss: sharded ranks must pair up in each
        # forward and backward. The step is skipped below if any rank saw one.
        part_loss = _backward(policy, batch.select(rows), settings, weight, ranks, totals)
        finite = finite and math.isfinite(part_loss)
    totals.reduce()
    if not _everywhere(finite):
        return _skip(optimizer, batch, lr, started, f"non-finite loss ({totals.loss})", totals)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [p.grad for p in params if p.grad is not None]
    grad_norm = _total_norm(grads)
    if not math.isfinite(grad_norm):
        return _skip(
            optimizer, batch, lr, started, f"non-finite gradient norm ({grad_norm})", totals
        )
    updating = time.perf_counter()
    if settings.max_grad_norm is not None and grads:
        torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    done = time.perf_counter()
    return StepResult(
        loss=totals.loss,
        entropy=totals.entropy(),
        grad_norm=grad_norm,
        lr=lr,
        tokens=batch.tokens,
        samples=batch.samples,
        seconds=done - started,
        stats=totals.merged_stats(),
        mismatch=figures(totals.mismatch),
        optimizer_seconds=done - updating,
    )


def _world() -> tuple[int, int]:
    """(rank, world size) of the trainer ranks; (0, 1) for a lone trainer."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def my_share(
    parts: list[Tensor], weights: list[float], rank: int, world: int
) -> list[tuple[Tensor, float | None]]:
    """This rank's micro-batches: every world-th one. Each rank gets as many, padded with a
    weightless stand-in (None), because sharded ranks gather and reduce in every forward and
    backward."""
    pairs: list[tuple[Tensor, float | None]] = [*zip(parts, weights, strict=True)]
    mine = pairs[rank::world]
    rounds = -(-len(parts) // world)
    return mine + [(parts[0][:1], None)] * (rounds - len(mine))


def _everywhere(flag: bool) -> bool:
    """Whether `flag` holds on every rank."""
    if _world()[1] == 1:
        return flag
    value = torch.tensor([0.0 if flag else 1.0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() == 0.0)


def _total_norm(grads: list[Tensor]) -> float:
    """The gradients' total L2 norm (sharded gradients: over every rank's shards)."""
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def _backward(
    policy: Policy,
    part: Batch,
    settings: StepSettings,
    weight: float | None,
    ranks: int,
    totals: _Totals,
) -> float:
    """Forward and backward one micro-batch; returns its (unweighted) loss. A weightless
    stand-in (None) only keeps this rank in step with the others: zero gradient, no totals.

    FSDP averages gradients over the trainer ranks, and the micro-batch weights already sum to
    the whole batch's loss, so each backward is scaled back up by their number."""
    logprobs, entropy = policy.completion_logprobs(part, packed=settings.packed)
    part_loss, stats = compute_policy_loss(
        logprobs,
        part.old_logprobs,
        part.advantages,
        part.loss_mask,
        part.group_index,
        loss=settings.loss,
        aggregation=settings.aggregation,
        epsilon_max=settings.epsilon_max,
        epsilon_low=settings.epsilon_low,
        epsilon_high=settings.epsilon_high,
        correction=settings.correction,
    )
    value = float(part_loss.detach())
    scale = 0.0 if weight is None else weight * ranks
    (part_loss * scale).backward()  # a non-finite step is discarded after all parts
    if weight is not None:
        mismatch = mismatch_sums(logprobs, part.old_logprobs, part.loss_mask, part.lags)
        totals.add(value * weight, entropy, part.loss_mask, stats, mismatch)
    return value


def _skip(
    optimizer: Optimizer, batch: Batch, lr: float, started: float, reason: str, totals: _Totals
) -> StepResult:
    optimizer.zero_grad(set_to_none=True)
    return StepResult(
        loss=math.nan,
        entropy=totals.entropy(),
        grad_norm=math.nan,
        lr=lr,
        tokens=batch.tokens,
        samples=batch.samples,
        seconds=time.perf_counter() - started,
        stats=totals.merged_stats(),
        mismatch=figures(totals.mismatch),
        skipped=True,
        reason=reason,
    )


def plan_micro_batches(
    batch: Batch,
    micro_batch_samples: int | None,
    aggregation: AggregationMode,
    micro_batch_tokens: int | None = None,
) -> list[Tensor]:
    """Sample-index chunks of at most ``micro_batch_samples`` samples, or of at most
    ``micro_batch_tokens`` tokens (a sample longer than that alone); see the module docstring."""
    total = batch.samples
    device = batch.input_ids.device
    if micro_batch_tokens is not None:
        if micro_batch_tokens < 1:
            raise InputError(f"micro_batch_tokens must be >= 1; got {micro_batch_tokens}")
        lengths = batch.attention_mask.sum(dim=-1).tolist()
        if aggregation == "prompt":
            _, counts = torch.unique_consecutive(batch.group_index, return_counts=True)
            units = counts.tolist()
        else:
            units = [1] * total
        return [
            torch.arange(a, b, device=device)
            for a, b in _pack_groups(units, micro_batch_tokens, lengths)
        ]
    if micro_batch_samples is None or micro_batch_samples >= total:
        return [torch.arange(total, device=device)]
    if micro_batch_samples < 1:
        raise InputError(f"micro_batch_samples must be >= 1; got {micro_batch_samples}")
    if aggregation != "prompt":
        return list(torch.arange(total, device=device).split(micro_batch_samples))
    _, counts = torch.unique_consecutive(batch.group_index, return_counts=True)
    return [
        torch.arange(a, b, device=device)
        for a, b in _pack_groups(counts.tolist(), micro_batch_samples)
    ]


def _pack_groups(
    sizes: list[int], limit: int, weights: list[int] | None = None
) -> list[tuple[int, int]]:
    """(start, stop) sample ranges: consecutive whole groups (of ``sizes`` samples) weighing up
    to ``limit``, or pieces of one group. A sample weighs 1, or its entry of ``weights``."""
    weight = weights or [1] * sum(sizes)
    upto = list(itertools.accumulate(weight, initial=0))  # upto[i]: weight of samples 0..i-1
    chunks: list[tuple[int, int]] = []
    open_chunk = False  # whether the last chunk holds whole groups and may take more
    start = 0
    for size in sizes:
        stop = start + size
        if upto[stop] - upto[start] > limit:
            chunks += _pieces(start, stop, limit, weight)
            open_chunk = False
        elif open_chunk and upto[stop] - upto[chunks[-1][0]] <= limit:
            chunks[-1] = (chunks[-1][0], stop)
        else:
            chunks.append((start, stop))
            open_chunk = True
        start = stop
    return chunks


def _pieces(start: int, stop: int, limit: int, weight: list[int]) -> list[tuple[int, int]]:
    """Consecutive pieces of samples start..stop, each within ``limit`` (or one sample)."""
    pieces: list[tuple[int, int]] = []
    begin, load = start, 0
    for i in range(start, stop):
        if i > begin and load + weight[i] > limit:
            pieces.append((begin, i))
            begin, load = i, 0
        load += weight[i]
    return [*pieces, (begin, stop)]


def micro_batch_weights(
    batch: Batch, parts: list[Tensor], aggregation: AggregationMode
) -> list[float]:
    """Weight of each micro-batch's aggregated loss so that the weighted sum is the full loss."""
    tokens = batch.loss_mask.sum(dim=-1).float()  # trained tokens per sample
    if aggregation == "token":
        shares = [tokens[rows].sum() for rows in parts]
        return _normalised(shares, tokens.sum())
    if aggregation == "sample":
        present = (tokens > 0).float()
        return _normalised([present[rows].sum() for rows in parts], present.sum())
    inverse, groups = dense_groups(batch.group_index)
    group_tokens = group_sums(tokens, inverse, groups)
    prompts = (group_tokens > 0).sum()
    shares = []
    for rows in parts:
        in_part = group_sums(tokens[rows], inverse[rows], groups)
        shares.append((in_part / group_tokens.clamp(min=1)).sum())
    return _normalised(shares, prompts)


def _normalised(shares: list[Tensor], total: Tensor) -> list[float]:
    denominator = float(total)
    return [float(share) / denominator if denominator > 0 else 0.0 for share in shares]


class _Totals:
    """Running sums over micro-batches: loss, entropy over trained tokens, recipe statistics and
    mismatch sums per lag."""

    def __init__(self) -> None:
        self.loss = 0.0
        self.entropy_sum = 0.0
        self.tokens = 0.0
        self.parts: list[tuple[float, dict[str, float]]] = []
        self.mismatch: dict[int, LagSums] = {}

    def add(
        self,
        loss: float,
        entropy: Tensor,
        mask: Tensor,
        stats: dict[str, float],
        mismatch: dict[int, LagSums],
    ) -> None:
        self.mismatch = merge([self.mismatch, mismatch])
        self.loss += loss
        self.entropy_sum += float(torch.where(mask, entropy, 0.0).sum())
        self.tokens += float(mask.sum())
        self.parts.append((float(mask.sum()), stats))

    def reduce(self) -> None:
        """Sum over the trainer ranks (each holds its own micro-batches' totals)."""
        if _world()[1] == 1:
            return
        sums = torch.tensor([self.loss, self.entropy_sum, self.tokens], dtype=torch.float64)
        dist.all_reduce(sums)
        self.loss, self.entropy_sum, self.tokens = (float(v) for v in sums)
        everyone: list[Any] = [None] * _world()[1]
        dist.all_gather_object(everyone, (self.parts, self.mismatch))
        self.parts = [part for parts, _ in everyone for part in parts]
        self.mismatch = merge(mismatch for _, mismatch in everyone)

    def entropy(self) -> float:
        return self.entropy_sum / self.tokens if self.tokens else 0.0

    def merged_stats(self) -> dict[str, float]:
        """Token-weighted means, except ``*_max``/``*_min`` (extremes) and ``tokens`` (a sum)."""
        merged: dict[str, float] = {}
        present = [(n, s) for n, s in self.parts if n > 0] or self.parts
        total = sum(n for n, _ in present)
        for key in self.parts[0][1] if self.parts else {}:
            values = [s[key] for _, s in present]
            if key == "tokens":
                merged[key] = sum(s[key] for _, s in self.parts)
            elif key.endswith("_max"):
                merged[key] = max(values)
            elif key.endswith("_min"):
                merged[key] = min(values)
            else:
                merged[key] = sum(n * s[key] for n, s in present) / total if total else 0.0
        return merged
