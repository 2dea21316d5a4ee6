"""scalerl's side of bench/trl_bench.py: `scalerl run` as a subprocess, watched until its own
evaluation reaches the target, then its checkpoints read by `scalerl.hfeval`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trl_shared import STOP_GRACE_S, LoadSampler, Result, eval_seed, point, reached

from scalerl.spec import load_run


def scalerl_command() -> list[str]:
    script = Path(sys.executable).parent / "scalerl"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "scalerl.cli"]


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of `root` and all its descendants (their waited-for children
    included), from /proc; 0.0 where /proc is not there."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # After the command name: state ppid ... utime(12) stime(13) cutime(14) cstime(15).
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(x) for x in fields[11:15]) / tick
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        total += times.get(pid, 0.0)
        frontier += [child for child, parent in parents.items() if parent == pid]
    return total


def watch_run(
    spec_file: Path, out: Path, log_file: Path, cap_s: float, gain: float, extra_evals: int
) -> tuple[list[dict[str, Any]], str, int | None]:
    """Run `scalerl run` and read its history as it grows, until its own (engine) evaluation
    confirms start + `gain` and `extra_evals` more evaluations are in, or the cap; return the
    history rows (with wall and CPU seconds since spawn), why it stopped, and its exit code."""
    placement = load_run(spec_file).spec.placement
    history = out / "history.jsonl"
    seen: list[dict[str, Any]] = []
    stop_after: int | None = None  # evaluations to wait for
    command = [*scalerl_command(), "run", str(spec_file), "--out", str(out), "--no-progress"]
    with log_file.open("wb") as log:
        spawned = time.monotonic()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        reason = "the run ended"
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                lines = history.read_text().splitlines() if history.is_file() else []
                for line in lines[len(seen) :]:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        break  # being written; next tick
                    row["since_spawn_s"] = time.monotonic() - spawned
                    row["cpu_s"] = tree_cpu_seconds(proc.pid)
                    seen.append(row)
                    print(
                        f"[{placement}] step {row['step']:4d}  engine pass {row['pass_rate']:.3f}"
                        f" ± {row['pass_rate_se']:.3f}  wall {row['since_spawn_s']:7.1f} s",
                        flush=True,
                    )
                if stop_after is None and seen and reached(seen, seen[0]["pass_rate"] + gain):
                    stop_after = len(seen) + extra_evals
                if stop_after is not None and len(seen) >= stop_after:
                    reason = "the engine's evaluation reached the target"
                    break
                if time.monotonic() - spawned >= cap_s:
                    reason = "cap"
                    break
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the runner stops its gang as on Ctrl-C
                try:
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return seen, reason, proc.returncode


def evaluate_checkpoints(
    spec_file: Path, out: Path, rows: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[int]]:
    """`scalerl.hfeval` on the base model (step 0) and on the checkpoint of each history row's
    step, with the history's clocks beside; and the steps that had no checkpoint."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    from scalerl.hfeval import held_out, iter_checkpoints, load_model, load_spec

    transformers_logging.disable_progress_bar()  # one "Loading weights" bar per checkpoint
    run = load_spec(spec_file)
    spec = run.spec
    units = spec.processes  # the compute clock counts process-hours on CPU
    held = held_out(run, AutoTokenizer.from_pretrained(spec.model.path), spec.model.path)
    folders = dict(iter_checkpoints(out))
    evals, missing = [], []
    for row in rows:
        step = int(row["step"])
        folder = Path(spec.model.path) if step == 0 else folders.get(step)
        if folder is None:
            missing.append(step)
            continue
        model = load_model(folder, "float32", spec.model.fp32_lm_head, base=spec.model.path)
        k = spec.evaluation.generations_per_prompt
        entry = point(held.evaluate(model, k, eval_seed(spec, step), label=str(folder)), step)
        seconds = row["trainer_seconds"]
        entry["engine_pass_rate"] = row["pass_rate"]
        entry["engine_stderr"] = row["pass_rate_se"]
        entry["train_s"] = row["compute"] / units * 3600 - seconds.get("checkpoint", 0.0)
        entry["since_spawn_s"] = row["since_spawn_s"]
        entry["cpu_s"] = row["cpu_s"]
        entry["generated_samples"] = int(row["generation"].get("generated_samples", 0))
        entry["model_tokens"] = row["generation"].get("generated_tokens")
        evals.append(entry)
    return evals, missing


def run_ours(
    spec_file: Path, work: Path, cap_s: float, gain: float, extra_evals: int = 2
) -> Result:
    """`scalerl run` on `spec_file` until it reaches its start + `gain` (or the cap), then its
    checkpoints read by `scalerl.hfeval`."""
    placement = load_run(spec_file).spec.placement
    out = work / placement
    log_file = work / f"{placement}.log"
    result = Result(
        f"scalerl {placement}", evaluator="scalerl.hfeval on its checkpoints, after the run"
    )
    with LoadSampler() as load:
        rows, reason, code = watch_run(spec_file, out, log_file, cap_s, gain, extra_evals)
    result.load = load.summary()
    if not rows:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-25:])
        result.note = f"no evaluation recorded (exit {code}); log tail:\n{tail}"
        return result
    result.evals, missing = evaluate_checkpoints(spec_file, out, rows)
    result.target = result.start + gain if result.evals else None
    result.hit = result.first(gain)
    last = result.hit or (result.evals[-1] if result.evals else {"step": 0})
    result.steps = int(last["step"])
    result.samples = int(last.get("generated_samples", 0))
    final = rows[-1]
    seconds = final["trainer_seconds"]
    stepping = seconds.get("wall", 0.0) - sum(
        seconds.get(phase, 0.0) for phase in ("start", "evaluate", "checkpoint")
    )
    engine_hit = reached(rows, rows[0]["pass_rate"] + gain)
    result.extra = {
        "compute_units": load_run(spec_file).spec.processes,
        "stopped_because": reason,
        "engine_reached_at": engine_hit["step"] if engine_hit else None,
        "steps_without_checkpoint": missing,
        # Wall seconds per optimizer step; start-up, evaluations and checkpoints left out.
        "seconds_per_step": stepping / final["step"] if final["step"] else None,
    }
    if result.hit is None:
        result.note = (
            f"not reached within the {cap_s / 60:g}-minute cap"
            if reason == "cap"
            else f"not reached: {reason} (exit {code})"
        )
    return result
