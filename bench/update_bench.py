"""Where a generator's in-flight weight update goes: one vLLM engine on the demo model and a trainer
thread sending it new versions over the sync group, as in a run.

Each update is timed as a whole (`GenerationEngine.update_weights`, the pause the profile
reports) and by part: pausing the engine, the worker's receive-and-reload RPC, the version label,
resuming. The same RPC with an empty version (no tensors) gives the fixed cost of the round trip
and of the protocol, apart from moving and loading the weights.

    .venv/bin/python bench/update_bench.py [--updates 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from pathlib import Path

from scalerl.demo.assets import default_cache_dir, prepare_demo
from scalerl.generator.engine import DEFAULT_PHRASE, EngineConfig, GenerationEngine
from scalerl.ports import free_port
from scalerl.recipe import InterruptionPlan
from scalerl.sync import WeightSender, connect
from scalerl.trainer import load_policy

TIMEOUT_S = 60.0


def trainer(
    port: int, model: Path, versions: list[tuple[int, bool]], ready: threading.Event
) -> None:
    """Rank 0: sends each (version, empty) in turn, the demo's weights or nothing."""
    weights = list(load_policy(model, fp32_lm_head=True).named_weights())
    with connect("127.0.0.1", port, 2, 0, timeout_s=TIMEOUT_S) as group:
        ready.set()
        sender = WeightSender(group)
        for version, empty in versions:
            sender.send([] if empty else weights, version)


async def measure(model: Path, updates: int, run_dir: str) -> dict[str, list[float]]:
    config = EngineConfig(
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
    )
    engine = GenerationEngine(config)
    await engine.start()
    port = free_port()
    plan = [(v, False) for v in range(1, updates + 1)]
    plan += [(v, True) for v in range(updates + 1, 2 * updates + 1)]
    plan += [(v, False) for v in range(2 * updates + 1, 3 * updates + 1)]
    ready = threading.Event()
    thread = threading.Thread(target=trainer, args=(port, model, plan, ready), daemon=True)
    thread.start()
    times: dict[str, list[float]] = {k: [] for k in ("pause", "rpc", "label", "resume", "empty")}
    times["whole"] = []
    try:
        await engine.init_weight_sync("127.0.0.1", port, 2, 1, TIMEOUT_S)
        llm = engine._ready()[0]
        for version, _ in plan[:updates]:  # by part, as update_weights does them
            t0 = time.perf_counter()
            await llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)
            t1 = time.perf_counter()
            await llm.collective_rpc("receive_weights", args=(TIMEOUT_S, version))
            t2 = time.perf_counter()
            await llm.update_weight_version(str(version))
            t3 = time.perf_counter()
            await llm.resume_generation()
            t4 = time.perf_counter()
            parts = (t1 - t0, t2 - t1, t3 - t2, t4 - t3)
            for key, seconds in zip(("pause", "rpc", "label", "resume"), parts, strict=True):
                times[key].append(seconds)
        for version, _ in plan[updates : 2 * updates]:  # the round trip with nothing in it
            t0 = time.perf_counter()
            await llm.collective_rpc("receive_weights", args=(TIMEOUT_S, version))
            times["empty"].append(time.perf_counter() - t0)
        for version, _ in plan[2 * updates :]:  # what a generator pays
            times["whole"].append(await engine.update_weights(version, TIMEOUT_S))
    finally:
        thread.join(TIMEOUT_S)
        await engine.shutdown()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=10)
    args = parser.parse_args()
    model = prepare_demo(default_cache_dir()).model_path
    with tempfile.TemporaryDirectory() as run_dir:
        times = asyncio.run(measure(model, args.updates, run_dir))
    policy = load_policy(model, fp32_lm_head=True)
    size = sum(t.numel() * t.element_size() for _, t in policy.named_weights())
    print(f"weight update bench: demo model, {size / 2**20:.1f} MB, median of {args.updates}")
    labels = {
        "whole": "update_weights (the generator's pause)",
        "pause": "  pause (the engine core's scheduler)",
        "rpc": "  receive + reload RPC",
        "label": "  update_weight_version",
        "resume": "  resume_generation",
        "empty": "receive RPC of an empty version",
    }
    for key, label in labels.items():
        print(f"{label:<42} {statistics.median(times[key]) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
