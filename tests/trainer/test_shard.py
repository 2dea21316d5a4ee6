"""Sharded trainer ranks (FSDP2 over gloo): one step on two ranks is the one-rank step, and what
two ranks checkpoint resumes on one.

Each rank is a real process; they meet through a TCPStore as the trainer ranks of a run do.
"""

from __future__ import annotations

import math
import multiprocessing as mp
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from scalerl.ports import free_port
from scalerl.rollout.records import RolloutGroup
from scalerl.spec import LoraSpec
from scalerl.trainer import (
    Batch,
    StepSettings,
    build_batch,
    build_optimizer,
    load_policy,
    train_step,
)
from scalerl.trainer.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    write_shared,
)
from scalerl.trainer.shard import (
    Ranks,
    checkpoint_layers,
    end_rank_process,
    full_weights,
    init_ranks,
    is_sharded,
    leave_ranks,
    shard_policy,
)

STEP = {
    "loss": "cispo",
    "aggregation": "prompt",
    "epsilon_max": 4.0,
    "epsilon_low": 0.2,
    "epsilon_high": 0.28,
    "max_grad_norm": 1.0,
}
BY_FOURS = StepSettings(**STEP, micro_batch_samples=4)
LORA = LoraSpec(rank=4, alpha=8)
TIMEOUT_S = 120


def fixed_batch(make_group: Any, model_dir: Path) -> Batch:
    """Groups of varied lengths and rewards, old log-probs from the policy itself."""
    policy = load_policy(model_dir, fp32_lm_head=True)
    groups: list[RolloutGroup] = []
    for g in range(6):
        rewards = [1.0 if (g + i) % 3 == 0 else -1.0 for i in range(4)]
        lengths = [3 + (g * 5 + i * 3) % 9 for i in range(4)]
        groups.append(make_group(rewards, lengths=lengths, prompt_length=2 + g, seed=g + 1))
    batch, _ = build_batch(groups, current_version=0, max_off_policy=None, pad_id=policy.pad_id)
    assert batch is not None
    with torch.no_grad():
        logprobs, _ = policy.completion_logprobs(batch)
    return replace(batch, old_logprobs=logprobs)


def learner(
    model_dir: Path, *, sharded: bool, checkpointing: bool = False, lora: LoraSpec | None = None
) -> tuple[Any, Any, Any]:
    """Policy, optimizer and schedule, as a trainer rank builds them (`lora`: an adapter on the
    frozen model, its B drawn from a fixed seed so that it is not zero)."""
    policy = load_policy(model_dir, fp32_lm_head=True, lora=lora)
    if lora is not None:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, parameter in policy.model.named_parameters():
                if ".lora_B." in name:
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    if checkpointing:
        checkpoint_layers(policy)
    if sharded:
        shard_policy(policy)
        assert is_sharded(policy)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-15, warmup_steps=0
    )
    return policy, optimizer, scheduler


def step_on(
    model_dir: Path, batch: Batch, memory: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], Any]:
    """One step of this process's policy (sharded if a process group is up): full weights.
    ``memory``: micro-batch size or token budget, packing, activation checkpointing."""
    memory = dict(memory)
    checkpointing = memory.pop("checkpointing", False)
    lora = LORA if memory.pop("lora", False) else None
    trio = learner(model_dir, sharded=dist.is_initialized(), checkpointing=checkpointing, lora=lora)
    result = train_step(*trio, batch, StepSettings(**STEP, **memory))
    return {name: t.clone() for name, t in full_weights(trio[0])}, result


def as_rank(rank: int, world: int, port: int, gpus: bool, work: Any, *args: Any) -> None:
    """A process's body: join the ranks through a TCPStore (gloo, or NCCL with one GPU per rank),
    do `work(rank, world, ...)`."""
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if gpus else torch.device("cpu")
    if gpus:
        torch.cuda.set_device(device)
    store = dist.TCPStore(
        "127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=TIMEOUT_S)
    )
    init_ranks(store, rank, world, device, TIMEOUT_S)
    try:
        work(rank, world, *args)
    except BaseException:
        leave_ranks(finished=False)
        raise
    leave_ranks(finished=True)
    end_rank_process(0)  # as a trainer rank ends


def run_ranks(world: int, work: Any, *args: Any, gpus: bool = False) -> None:
    """`work` on `world` real processes; each must exit 0."""
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=as_rank, args=(r, world, port, gpus, work, *args)) for r in range(world)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(TIMEOUT_S)
    assert [proc.exitcode for proc in procs] == [0] * world


def one_step(rank: int, world: int, model_dir: Path, batch: Batch, memory: Any, out: Path) -> None:
    weights, result = step_on(model_dir, batch, memory)
    if rank == 0:
        torch.save({"weights": weights, "result": result}, out)


@pytest.mark.slow  # gloo process groups of 2-4 ranks: 10-20 s each
@pytest.mark.parametrize(
    ("world", "memory"),
    [
        (2, {"micro_batch_samples": 4}),
        (4, {"micro_batch_samples": 4}),  # six micro-batches: two ranks run a stand-in
        (2, {"micro_batch_tokens": 50, "packed": True, "checkpointing": True}),
        (2, {"micro_batch_samples": 4, "lora": True}),
    ],
    ids=["2-ranks", "4-ranks", "2-ranks-packed-token-budget-checkpointed", "2-ranks-lora"],
)
def test_a_sharded_step_equals_the_one_rank_step(
    world: int, memory: dict[str, Any], model_dir: Path, make_group: Any, tmp_path: Path
) -> None:
    batch = fixed_batch(make_group, model_dir)
    alone_memory = {"micro_batch_samples": 4, "lora": memory.get("lora", False)}
    alone, alone_result = step_on(model_dir, batch, alone_memory)
    run_ranks(world, one_step, model_dir, batch, memory, tmp_path / "rank0.pt")
    sharded = torch.load(tmp_path / "rank0.pt", weights_only=False)
    result = sharded["result"]
    assert sharded["weights"].keys() == alone.keys()
    for name, tensor in alone.items():
        torch.testing.assert_close(sharded["weights"][name], tensor, rtol=1e-5, atol=1e-6)
    assert not result.skipped
    assert math.isclose(result.loss, alone_result.loss, rel_tol=1e-5, abs_tol=1e-7)
    assert math.isclose(result.grad_norm, alone_result.grad_norm, rel_tol=1e-5)
    assert math.isclose(result.entropy, alone_result.entropy, rel_tol=1e-5)
    assert result.tokens == alone_result.tokens
    # Each rank's mismatch sums, gathered, are the whole batch's (every token counted once).
    assert result.mismatch.keys() == alone_result.mismatch.keys()
    for lag, figures in alone_result.mismatch.items():
        assert result.mismatch[lag].tokens == figures.tokens
        assert math.isclose(result.mismatch[lag].abs_mean, figures.abs_mean, abs_tol=1e-6)


def step_and_checkpoint(
    rank: int, world: int, model_dir: Path, batch: Batch, root: Path, lora: LoraSpec | None
) -> None:
    """Step once and checkpoint: rank 0 saves, the others follow its announcement."""
    policy, optimizer, scheduler = learner(model_dir, sharded=True, lora=lora)
    train_step(policy, optimizer, scheduler, batch, BY_FOURS)
    ranks = Ranks(rank, world)
    if ranks.leader:
        save_checkpoint(
            root, 1, policy=policy, optimizer=optimizer, scheduler=scheduler,
            state={"version": 1}, ranks=ranks,
        )  # fmt: skip
    else:
        kind, payload = ranks.next()
        assert kind == "checkpoint"
        write_shared(Path(payload), policy, optimizer)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_a_two_rank_checkpoint_resumes_on_one_rank_exactly(
    model_dir: Path, make_group: Any, tmp_path: Path, lora: LoraSpec | None
) -> None:
    batch = fixed_batch(make_group, model_dir)
    root = tmp_path / "checkpoints"
    run_ranks(2, step_and_checkpoint, model_dir, batch, root, lora)
    saved = latest_checkpoint(root)
    assert saved is not None and (saved / "optimizer").is_dir()
    # A LoRA checkpoint is the adapter alone, gathered whole from both ranks' shards.
    assert (saved / "adapter_model.safetensors").is_file() == (lora is not None)

    # One rank, resumed from what two wrote, against one rank that never stopped: a second
    # step must agree, which needs the weights and AdamW's moments back exactly.
    reference = learner(model_dir, sharded=False, lora=lora)
    train_step(*reference, batch, BY_FOURS)
    # A full checkpoint is a model folder to load; a LoRA one goes onto the base.
    resumed = learner(saved if lora is None else model_dir, sharded=False, lora=lora)
    state = load_checkpoint(
        saved, policy=resumed[0], optimizer=resumed[1], scheduler=resumed[2],
        weights=lora is not None,
    )  # fmt: skip
    assert state["step"] == 1
    for policy, optimizer, scheduler in (reference, resumed):
        train_step(policy, optimizer, scheduler, batch, BY_FOURS)
    expected = dict(reference[0].named_weights(cast=False))
    for name, tensor in resumed[0].named_weights(cast=False):
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6)


# --- on GPUs: bf16 compute from float32 master weights, NCCL -------------------------------------

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(count: int) -> pytest.MarkDecorator:
    return pytest.mark.skipif(GPUS < count, reason=f"needs {count} GPU(s), this machine has {GPUS}")


def gpu_step(rank: int, world: int, model_dir: Path, batch: Batch, out: Path) -> None:
    """One step as a trainer rank on a GPU takes it: float32 masters, bf16 compute."""
    policy = load_policy(
        model_dir, dtype="bfloat16", fp32_lm_head=True, device=f"cuda:{rank}", master_weights=True
    )
    shard_policy(policy)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-15, warmup_steps=0
    )
    result = train_step(policy, optimizer, scheduler, batch, BY_FOURS)
    moments = {v.dtype for s in optimizer.state.values() for v in s.values() if v.dim()}
    weights = {name: t.float().cpu() for name, t in full_weights(policy, cast=False)}
    if rank == 0:
        masters = {p.dtype for p in policy.parameters()}
        torch.save({"weights": weights, "result": result, "dtypes": masters | moments}, out)


def steps_agree(weights: dict[str, torch.Tensor], reference: dict, model_dir: Path) -> None:
    """Two first AdamW steps from the weights in `model_dir` agree as bf16 compute allows: each
    moves a weight by about lr; a few small gradients may change sign, most weights land within
    a fraction of it."""
    start = dict(load_policy(model_dir, fp32_lm_head=True).named_weights(cast=False))
    for name, expected in reference.items():
        moved = (expected - start[name]).abs().mean()
        off = (weights[name] - expected).abs()
        assert off.max() <= 2.5e-3, name
        assert off.mean() <= 0.1 * moved, name


@pytest.mark.gpu
@needs_gpus(1)
def test_on_a_gpu_a_step_computes_in_bf16_from_float32_masters(
    bf16_model_dir: Path, make_group: Any, tmp_path: Path
) -> None:
    batch = fixed_batch(make_group, bf16_model_dir)
    run_ranks(1, gpu_step, bf16_model_dir, batch, tmp_path / "gpu.pt", gpus=True)
    on_gpu = torch.load(tmp_path / "gpu.pt", weights_only=False)
    assert on_gpu["dtypes"] == {torch.float32}  # parameters and AdamW moments
    reference, _ = step_on(bf16_model_dir, batch, {"micro_batch_samples": 4})
    steps_agree(on_gpu["weights"], reference, bf16_model_dir)


@pytest.mark.gpu
@needs_gpus(2)
def test_two_nccl_ranks_step_as_one_gpu_does(
    bf16_model_dir: Path, make_group: Any, tmp_path: Path
) -> None:
    batch = fixed_batch(make_group, bf16_model_dir)
    run_ranks(1, gpu_step, bf16_model_dir, batch, tmp_path / "one.pt", gpus=True)
    run_ranks(2, gpu_step, bf16_model_dir, batch, tmp_path / "two.pt", gpus=True)
    one, two = (torch.load(tmp_path / f, weights_only=False) for f in ("one.pt", "two.pt"))
    steps_agree(two["weights"], one["weights"], bf16_model_dir)
    assert math.isclose(two["result"].loss, one["result"].loss, rel_tol=1e-2, abs_tol=1e-3)
