"""Weight-sync throughput: our bucketed broadcast against a raw flat broadcast and per-tensor ones.

Three local processes (rank 0 sends, ranks 1 and 2 receive) over gloo move a tiny-Llama-shaped
state dict (~100M float32 values in ~270 tensors) three ways:
  (a) ours      WeightSender / WeightReceiver: header, layout, buckets, checksums;
  (b) raw       one broadcast of the same bytes, flattened before the clock starts;
  (c) per-tensor one collective per tensor, the naive approach.
Rank 0 times each from a barrier to a barrier; the median of the repeats is printed.

    .venv/bin/python bench/sync_bench.py [--layers 22] [--bucket-mb 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time
from collections.abc import Callable

import torch

from scalerl.sync import SyncGroup, WeightReceiver, WeightSender, connect

WORLD = 3


def llama_like(
    layers: int, hidden: int = 512, mlp: int = 1408, vocab: int = 32000
) -> list[tuple[str, torch.Tensor]]:
    """Shapes of a small Llama with q/k/v biases: 12 tensors per layer plus embeddings."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + f"self_attn.{n}_proj.weight", (hidden, hidden)) for n in "qkvo"]
        shapes += [(p + f"self_attn.{n}_proj.bias", (hidden,)) for n in "qkv"]
        shapes += [
            (p + "mlp.gate_proj.weight", (mlp, hidden)),
            (p + "mlp.up_proj.weight", (mlp, hidden)),
        ]
        shapes += [(p + "mlp.down_proj.weight", (hidden, mlp))]
        shapes += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return [(name, torch.empty(shape).uniform_(-0.05, 0.05)) for name, shape in shapes]


def barrier(group: SyncGroup) -> None:
    """Every rank broadcasts once, so rank 0 returns only after all ranks got here."""
    token = torch.zeros(1)
    for src in range(group.world_size):
        group.broadcast(token, src=src)


def timed(group: SyncGroup, action: Callable[[], object]) -> float:
    barrier(group)
    started = time.perf_counter()
    action()
    barrier(group)
    return time.perf_counter() - started


def rank_main(rank: int, port: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # three processes share the machine's cores
    group = connect("127.0.0.1", port, WORLD, rank, timeout_s=120)
    tensors = llama_like(args.layers)
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in tensors])
    if rank != 0:
        tensors = [(name, torch.empty_like(t)) for name, t in tensors]
        flat = torch.empty_like(flat)
    methods = {
        "ours": ours(group, tensors, args.bucket_mb, keep_buffer=True),
        "ours-fresh": ours(group, tensors, args.bucket_mb, keep_buffer=False),
        "raw": lambda: group.broadcast(flat),
        "per-tensor": lambda: [group.broadcast(t) for _, t in tensors],
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    for repeat in range(args.repeats + 1):  # round 0 warms buffers up and is not counted
        for name, action in methods.items():  # interleaved, so machine noise hits all alike
            seconds = timed(group, action)
            if repeat:
                times[name].append(seconds)
    if rank == 0:
        report(times, flat.numel(), len(tensors), args)
    group.close()


def ours(
    group: SyncGroup, tensors: list[tuple[str, torch.Tensor]], bucket_mb: int, keep_buffer: bool
) -> Callable[[], object]:
    if group.rank == 0:
        sender = WeightSender(group, bucket_bytes=bucket_mb << 20)
        return lambda: sender.send(tensors, version=1)
    return WeightReceiver(group, keep_buffer=keep_buffer).receive


def report(
    times: dict[str, list[float]], nbytes: int, count: int, args: argparse.Namespace
) -> None:
    median = {name: statistics.median(values) for name, values in times.items()}
    buckets = -(-nbytes // (args.bucket_mb << 20))
    print(
        f"sync bench: 1 sender + 2 receivers, gloo on CPU, {count} tensors, "
        f"{nbytes / 1e6:.1f} MB, bucket {args.bucket_mb} MiB ({buckets} buckets), "
        f"median of {args.repeats} after a warm-up round"
    )
    labels = {
        "ours": "(a) ours, keep_buffer=True (checksummed)",
        "ours-fresh": "    ours, default: new receive buffer per version",
        "raw": "(b) raw flat broadcast (pre-flattened)",
        "per-tensor": f"(c) per-tensor broadcasts ({count} collectives)",
    }
    for name, label in labels.items():
        seconds = median[name]
        runs = ", ".join(f"{t:.3f}" for t in times[name])
        print(f"  {label:<50} {seconds:7.3f} s  {nbytes / seconds / 1e9:6.2f} GB/s  [{runs}]")
    print(
        f"  ours / raw = {median['ours'] / median['raw']:.2f}   "
        f"per-tensor / ours = {median['per-tensor'] / median['ours']:.2f}   "
        f"ours-fresh / raw = {median['ours-fresh'] / median['raw']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=22, help="22 layers is ~413 MB float32")
    parser.add_argument("--bucket-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, port, args)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    failed = [r for r, proc in enumerate(procs) if proc.exitcode != 0]
    if failed:
        raise SystemExit(f"ranks {failed} failed")


if __name__ == "__main__":
    main()
