"""Trainer ranks: tokens/s and memory per rank, one rank against two (FSDP2 over gloo, CPU), and
packed micro-batches against padded ones.

Each rank is a process; every configuration steps on the same fixed batch, whose completions
vary in length as real ones do (so padding wastes compute). Printed per rank: trained tokens
per second, peak resident memory, and the bytes of parameters + gradients + AdamW state the rank
holds. From the measured bytes per parameter it prints the largest model a given memory holds on
one rank and sharded over N.

    .venv/bin/python bench/trainer_bench.py [--steps 5] [--layers 8] [--hidden 512] [--gpu]

With --gpu (where there is one) the same on GPUs: bf16 compute from float32 master weights,
NCCL between ranks, peak GPU memory allocated.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import socket
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.rollout.records import RolloutGroup, Sample
from scalerl.trainer import StepSettings, build_batch, build_optimizer, load_policy, train_step
from scalerl.trainer.shard import end_rank_process, init_ranks, leave_ranks, shard_policy

STEP = {"loss": "cispo", "aggregation": "prompt", "epsilon_max": 4.0, "max_grad_norm": 1.0}
STEP |= {"epsilon_low": 0.2, "epsilon_high": 0.28}


def batch_for(policy: object, groups: int, size: int, longest: int) -> object:
    generator = torch.Generator().manual_seed(0)
    made = []
    for g in range(groups):
        samples = []
        for i in range(size):
            length = int(torch.randint(longest // 8, longest + 1, (1,), generator=generator))
            tokens = torch.randint(3, 100, (length,), generator=generator).tolist()  # demo vocab
            reward = 1.0 if (g + i) % 2 else 0.0
            samples.append(
                Sample(
                    tokens,
                    [-1.0] * length,
                    [0] * length,
                    [1] * length,
                    reward,
                    False,
                    False,
                    "stop",
                )
            )
        made.append(RolloutGroup(f"p{g}", [1, 2, 3, 4], samples, 0))
    batch, _ = build_batch(made, current_version=0, max_off_policy=None, pad_id=0)
    with torch.no_grad():
        logprobs, _ = policy.completion_logprobs(batch)  # type: ignore[attr-defined]
    return replace(batch, old_logprobs=logprobs)


def held_bytes(policy: object, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state this rank holds (its shards when sharded)."""
    total = 0
    for p in policy.parameters():  # type: ignore[attr-defined]
        local = p.to_local() if hasattr(p, "to_local") else p
        total += 2 * local.numel() * local.element_size()  # the parameter and its gradient
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                local = value.to_local() if hasattr(value, "to_local") else value
                total += local.numel() * local.element_size()
    return total


def rank_main(
    rank: int,
    world: int,
    packed: bool,
    gpu: bool,
    port: int,
    model: Path,
    steps: int,
    out: mp.Queue,
) -> None:
    torch.set_num_threads(max(1, torch.get_num_threads() // world))
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    if world > 1 or gpu:  # on a GPU one rank is sharded too: FSDP's mixed precision (bf16)
        store = (
            dist.TCPStore(
                "127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=300)
            )
            if world > 1
            else dist.HashStore()
        )
        init_ranks(store, rank, world, device, 300)
    policy = load_policy(
        model,
        dtype="bfloat16" if gpu else "float32",
        fp32_lm_head=True,
        device=device,
        master_weights=gpu,
    )
    batch = batch_for(policy, groups=8, size=4, longest=192)
    settings = StepSettings(**STEP, micro_batch_tokens=1024, packed=packed)
    if dist.is_initialized():
        shard_policy(policy)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-5, weight_decay=0.01, eps=1e-15, warmup_steps=0
    )
    train_step(policy, optimizer, scheduler, batch, settings)  # warm-up
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    tokens = 0
    for _ in range(steps):
        tokens += train_step(policy, optimizer, scheduler, batch, settings).tokens
    if gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    parameters = sum(p.numel() for p in policy.parameters())  # global counts (DTensor numel)
    if gpu:
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    held = held_bytes(policy, optimizer)
    out.put((world, packed, rank, tokens / seconds, peak_mb, held, parameters))
    if dist.is_initialized():
        out.close()
        out.join_thread()  # the figures reach the parent before the process ends
        leave_ranks(finished=True)
        end_rank_process(0)


def run(world: int, packed: bool, gpu: bool, model: Path, steps: int) -> list[tuple]:
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [
        ctx.Process(target=rank_main, args=(r, world, packed, gpu, port, model, steps, queue))
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    results = [queue.get(timeout=1200) for _ in procs]
    for proc in procs:
        proc.join()
    return sorted(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--memory-gb", type=float, default=80.0, help="for the capacity line")
    parser.add_argument(
        "--gpu", action="store_true", help="on GPUs: bf16 compute, float32 masters, NCCL"
    )
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.gpu and not gpus:
        print("trainer_bench --gpu: no GPU on this machine; nothing measured")
        return
    shape = TinyModelShape(
        hidden=args.hidden,
        layers=args.layers,
        heads=8,
        intermediate=4 * args.hidden,
        max_positions=256,
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = build_random_model(Path(tmp) / "model", shape=shape)
        rows = [
            *run(1, False, args.gpu, model, args.steps),
            *run(1, True, args.gpu, model, args.steps),
        ]
        if not args.gpu or gpus >= 2:
            rows += run(2, True, args.gpu, model, args.steps)
    # tokens/s: the whole batch's trained tokens per second of step (every rank steps on it all).
    head = f"{'ranks':>5} {'micro-batches':>13} {'rank':>4} {'tokens/s':>9}"
    print(f"{head} {'peak GPU MB' if args.gpu else 'peak RSS MB':>11} {'held MB':>8}")
    for world, packed, rank, rate, peak, held, _ in rows:
        kind = "packed" if packed else "padded"
        print(f"{world:>5} {kind:>13} {rank:>4} {rate:>9.0f} {peak:>11.0f} {held / 2**20:>8.1f}")
    print(f"packed / padded tokens/s on one rank: {rows[1][3] / rows[0][3]:.2f}x")
    parameters = rows[0][6]
    one = rows[0][5] / parameters
    two = [r[5] / parameters for r in rows if r[0] == 2]
    print(
        f"parameters {parameters / 1e6:.1f} M; bytes held per parameter (float32 parameter, "
        f"gradient, AdamW moments): 1 rank {one:.1f}"
        + (f", 2 ranks {max(two):.1f} each" if two else "")
    )
    budget = args.memory_gb * 2**30
    for ranks in (1, 2, 8, 64):
        per_parameter = one / ranks  # sharding divides every held byte by the rank count
        print(
            f"  largest model whose training state fits {args.memory_gb:g} GB per rank on "
            f"{ranks:>2} rank(s): {budget / per_parameter / 1e9:.1f} B parameters "
            "(activations not counted)"
        )


if __name__ == "__main__":
    main()
