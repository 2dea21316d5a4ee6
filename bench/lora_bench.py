"""LoRA against full fine-tuning: what a weight update moves and costs, what the trainer holds, and
(with --runs) how soon the demo gains +0.2 held-out pass rate.

    .venv/bin/python bench/lora_bench.py [--updates 5] [--rank 16] [--runs]

Models: the demo's (a tiny Llama, 0.6 M parameters) and a random Llama of about 30 M parameters
(hidden 512, 8 layers, MLP 2048). For each, full weights against a rank-`--rank` adapter on every
projection of the decoder blocks:

- **weight update**, median of `--updates`: colocated (`Colocation.load` of the tensors in memory,
  or `Colocation.load_adapter`: the adapter written as a folder in memory and loaded in place),
  and disaggregated (a trainer thread broadcasting to a separate vLLM engine over gloo; the
  engine's pause, `GenerationEngine.update_weights`). Bytes are the tensors that move. Then the
  colocated engine's sampling rate, 64 samples of 64 tokens, with the adapter and without.
- **trainer memory**: the bytes the trainer holds in a step, counted tensor by tensor:
  parameters, gradients (one per trainable parameter) and AdamW's two moments after one step
  (activations not counted).

`--runs` adds two colocated demo runs, full fine-tuning (examples/colocated.yaml, lr 1e-4) and
LoRA (examples/lora.yaml, lr 1e-3), 60 steps with an evaluation every 5: the training clock and
the step at which each first reads +0.2 over its step-0 evaluation, confirmed by the next
evaluation (one lucky draw does not count). A few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from scalerl.demo.assets import default_cache_dir, prepare_demo
from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.generator.colocation import Colocation
from scalerl.generator.engine import DEFAULT_PHRASE, EngineConfig, GenerationEngine
from scalerl.ports import free_port
from scalerl.recipe import InterruptionPlan
from scalerl.rollout.records import RolloutGroup, Sample
from scalerl.runfile import run_command, write_variant
from scalerl.spec import LoraSpec
from scalerl.status.history import read_history
from scalerl.sync import WeightSender, connect
from scalerl.trainer import (
    Policy,
    StepSettings,
    build_batch,
    build_optimizer,
    load_policy,
    train_step,
)
from scalerl.trainer.publish import tensor_bytes

TIMEOUT_S = 120.0
LARGER = TinyModelShape(hidden=512, layers=8, heads=8, intermediate=2048, max_positions=256)
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def engine_config(model: Path, run_dir: str, lora: LoraSpec | None) -> EngineConfig:
    return EngineConfig(
        model_path=str(model),
        dtype="float32",
        fp32_lm_head=True,
        max_model_len=256,
        temperature=1.0,
        seed=0,
        phrase=DEFAULT_PHRASE,
        plan=InterruptionPlan(thinking_budget=64, answer_budget=64, window=(64, 64), enabled=False),
        think_end=None,
        run_dir=run_dir,
        lora=lora,
    )


def perturb(policy: Policy) -> None:
    """A new version: every trainable tensor moved a little (what a step does)."""
    with torch.no_grad():
        for parameter in policy.model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 1e-3)


async def colocated_updates(
    model: Path, lora: LoraSpec | None, updates: int, run_dir: str
) -> tuple[list[float], int, float]:
    """Update seconds, bytes moved, and the engine's tokens/s sampling 64 x 64 tokens after."""
    colocation = Colocation()
    engine = GenerationEngine(engine_config(model, run_dir, lora), colocation=colocation)
    await engine.start()
    policy = load_policy(model, fp32_lm_head=True, lora=lora)
    seconds, moved = [], 0
    try:
        for version in range(1, updates + 1):
            perturb(policy)
            if lora is None:
                weights = list(policy.named_weights())
                moved = tensor_bytes(weights)
                took = await asyncio.to_thread(colocation.load, weights, version, TIMEOUT_S)
            else:
                moved = tensor_bytes(policy.named_weights(cast=False))
                took = await asyncio.to_thread(
                    colocation.load_adapter, policy.save_adapter, version, TIMEOUT_S
                )
            seconds.append(took)
            await engine.generate([1, 5, 6, 7], 1, max_tokens=4)  # the engine serves it
        started = time.perf_counter()
        samples = await engine.generate([1, 5, 6, 7], 64, max_tokens=64)
        rate = sum(len(s.completion_ids) for s in samples) / (time.perf_counter() - started)
    finally:
        await engine.shutdown()
    return seconds, moved, rate


async def broadcast_updates(
    model: Path, lora: LoraSpec | None, updates: int, run_dir: str
) -> tuple[list[float], int, float]:
    engine = GenerationEngine(engine_config(model, run_dir, lora))
    await engine.start()
    policy = load_policy(model, fp32_lm_head=True, lora=lora)
    port, ready = free_port(), threading.Event()
    versions: list[list[tuple[str, torch.Tensor]]] = []
    for _ in range(updates):
        perturb(policy)
        versions.append([(n, t.clone()) for n, t in policy.named_weights()])

    def trainer() -> None:
        with connect("127.0.0.1", port, 2, 0, timeout_s=TIMEOUT_S) as group:
            ready.set()
            sender = WeightSender(group)
            for version, weights in enumerate(versions, start=1):
                sender.send(weights, version)

    thread = threading.Thread(target=trainer, daemon=True)
    thread.start()
    seconds = []
    try:
        await engine.init_weight_sync("127.0.0.1", port, 2, 1, TIMEOUT_S)
        for version in range(1, updates + 1):
            seconds.append(await engine.update_weights(version, TIMEOUT_S))
            await engine.generate([1, 5, 6, 7], 1, max_tokens=4)
    finally:
        thread.join(TIMEOUT_S)
        await engine.shutdown()
    return seconds, tensor_bytes(versions[0]), math.nan


def held_bytes(model: Path, lora: LoraSpec | None) -> tuple[int, int, int, int]:
    """(parameters, gradients, AdamW moments, total) bytes after one optimizer step."""
    policy = load_policy(model, fp32_lm_head=True, lora=lora)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-4, weight_decay=0.0, eps=1e-15, warmup_steps=0
    )
    settings = StepSettings("cispo", "prompt", epsilon_max=4.0, epsilon_low=0.2, epsilon_high=0.28)
    train_step(policy, optimizer, scheduler, _batch(policy), settings)
    parameters = list(policy.model.parameters())
    weights = sum(p.numel() * p.element_size() for p in parameters)
    # Every trainable parameter holds a gradient of its size during the step (the step frees
    # them after it, so they are counted, not read).
    grads = sum(p.numel() * p.element_size() for p in parameters if p.requires_grad)
    moments = sum(
        t.numel() * t.element_size()
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor) and t.dim() > 0
    )
    return weights, grads, moments, weights + grads + moments


def _batch(policy: Policy) -> Any:
    samples = [
        Sample(
            completion_ids=list(range(10, 26)),
            logprobs=[-1.0] * 16,
            versions=[0] * 16,
            loss_mask=[1] * 16,
            reward=r,
            truncated=False,
            interrupted=False,
            finish_reason="stop",
        )  # fmt: skip
        for r in (1.0, -1.0, 1.0, -1.0)
    ]
    group = RolloutGroup(prompt_id="p", prompt_ids=[1, 5, 6, 7], samples=samples, generator=0)
    batch, _ = build_batch([group], current_version=0, max_off_policy=None, pad_id=policy.pad_id)
    return batch


def time_to_gain(history: list[dict[str, Any]], gain: float) -> tuple[int, float] | None:
    """(step, training seconds) of the first evaluation at start + gain whose next one is too."""
    target = history[0]["pass_rate"] + gain
    for here, after in zip(history, history[1:], strict=False):
        if here["pass_rate"] >= target and after["pass_rate"] >= target:
            return int(here["step"]), float(here["compute"]) * 3600.0
    return None


def demo_runs(work: Path) -> None:
    print("time to +0.2 held-out pass rate, demo, colocated (training clock: process-seconds)")
    results = {}
    for name, example in (("full, lr 1e-4", "colocated.yaml"), ("LoRA r16, lr 1e-3", "lora.yaml")):
        changes = {"evaluation": {"everySteps": 5}, "budget": {"maxSteps": 60}}
        spec = write_variant(EXAMPLES / example, work / example, {}, changes)
        out = work / example.removesuffix(".yaml")
        subprocess.run(run_command(spec, out), check=True, capture_output=True, timeout=1800)
        history = read_history(out / "history.jsonl")
        reached = time_to_gain(history, 0.2)
        results[name] = reached
        series = " ".join(f"{e['pass_rate']:.2f}" for e in history)
        at = "not reached" if reached is None else f"step {reached[0]}, {reached[1]:.0f} s"
        per_step = history[-1]["compute"] * 3600.0 / history[-1]["step"]
        print(f"  {name:<20} {at:<22} {per_step:.2f} s/step   pass rate every 5 steps: {series}")
    full, lora = results["full, lr 1e-4"], results["LoRA r16, lr 1e-3"]
    if full and lora:
        print(f"  LoRA / full time to +0.2: {lora[1] / full[1]:.2f}x")


async def updates_of(model: Path, rank: int, updates: int) -> None:
    lora = LoraSpec(rank=rank, alpha=2 * rank)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, spec in (("full", None), (f"LoRA r{rank}", lora)):
            for placement, measure in (("colocated", colocated_updates),
                                       ("broadcast", broadcast_updates)):  # fmt: skip
                took, moved, rate = await measure(model, spec, updates, f"{tmp}/{mode}-{placement}")
                rows[mode, placement] = (statistics.median(took), moved, rate)
    print(f"  {'weight update':<28}{'bytes':>12}{'median ms':>12}{'engine tokens/s':>17}")
    for (mode, placement), (seconds, moved, rate) in rows.items():
        shown = "" if math.isnan(rate) else f"{rate:.0f}"
        print(f"  {mode + ', ' + placement:<28}{moved:>12,}{seconds * 1000:>12.1f}{shown:>17}")
    for placement in ("colocated", "broadcast"):
        full, adapter = rows["full", placement], rows[f"LoRA r{rank}", placement]
        print(
            f"  {placement}: LoRA moves {adapter[1] / full[1]:.3f}x the bytes in "
            f"{adapter[0] / full[0]:.2f}x the time"
        )
    print(f"  {'trainer memory (bytes)':<28}{'parameters':>14}{'gradients':>12}{'moments':>12}"
          f"{'total':>14}")  # fmt: skip
    totals = {}
    for mode, spec in (("full", None), (f"LoRA r{rank}", lora)):
        weights, grads, moments, total = held_bytes(model, spec)
        totals[mode] = total
        print(f"  {mode:<28}{weights:>14,}{grads:>12,}{moments:>12,}{total:>14,}")
    print(f"  LoRA / full trainer memory: {totals[f'LoRA r{rank}'] / totals['full']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--runs", action="store_true", help="also the two demo runs")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the figures, not vLLM's start-up
    demo = prepare_demo(default_cache_dir()).model_path
    with tempfile.TemporaryDirectory() as tmp:
        larger = build_random_model(Path(tmp) / "larger", shape=LARGER)
        for name, model in (("demo model", demo), ("random 30 M model", larger)):
            size = sum(p.numel() for p in load_policy(model, fp32_lm_head=True).parameters())
            print(f"{name}: {size / 1e6:.1f} M parameters, float32")
            asyncio.run(updates_of(model, args.rank, args.updates))
        if args.runs:
            demo_runs(Path(tmp))


if __name__ == "__main__":
    main()
