"""Where a small local run's wall time goes outside its steps: the runner's checks, the gang's
start, the steps, and the stop, against the one cost no change here removes (importing what each
process needs, measured in the same run).

A demo-shaped run (examples/local.yaml: one trainer, two vLLM generators) of a few steps, its
trainer killed once after `--kill-at` so a restart is timed too:

    .venv/bin/python bench/start_bench.py [--steps 6] [--kill-at 3] [--generators 2]

Prints, in seconds: `checks` (`scalerl run` to its processes starting: the spec, the preflight,
the built-ins), `start` (processes started to the step-0 evaluation), `steps` (to the last
step), `stop` (the last step to `scalerl run`'s exit: final checkpoint, processes stopping, the
last fit) and, with a kill, `restart` (the kill to the next step); then `imports`, one process's
import of the trainer's and a generator's modules (vLLM), one after the other on an idle core,
and the ratio start / imports: what a gang's start costs beyond loading its code.

`--compare-kv` runs it twice more, each without a kill: the generators' KV cache sized for the
model (what runs get) and the fixed GiB of before (`VLLM_CPU_KVCACHE_SPACE=1`, which vLLM reads
over the engine's argument), and prints each one's start and the CPU seconds its generators had
used by the step-0 evaluation (vLLM zeroes the whole cache at start).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scalerl.runfile import run_command, write_variant

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def small(steps: int, generators: int) -> dict[str, object]:
    return {
        "recipe": {"batch": {"prompts": 8, "generationsPerPrompt": 4}},
        "data": {"validation": {"prompts": 32}},
        "evaluation": {"everySteps": 2, "generationsPerPrompt": 2},
        "budget": {"maxSteps": steps},
        "checkpoint": {"everySteps": 2},
        "generators": {"replicas": generators},
    }


def step_of(out: Path) -> int:
    try:
        return int(json.loads((out / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process `pid` has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_run(
    folder: Path,
    steps: int,
    kill_at: int | None,
    generators: int,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    spec = write_variant(EXAMPLES / "local.yaml", folder / "run.yaml", small(steps, generators))
    out = folder / "run"
    begun = time.monotonic()
    marks: dict[str, float] = {}
    proc = subprocess.Popen(
        run_command(spec, out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    killed_step = None
    while proc.poll() is None:
        now = time.monotonic() - begun
        if "launched" not in marks and (out / "processes.json").exists():
            marks["launched"] = now
        history = out / "history.jsonl"
        if "evaluated" not in marks and history.exists() and history.read_text().strip():
            marks["evaluated"] = now
            processes = json.loads((out / "processes.json").read_text())
            marks["generator_cpu"] = sum(
                cpu_seconds(p["pid"]) for role, p in processes.items() if role.startswith("gen")
            )
        step = step_of(out)
        if kill_at is not None and killed_step is None and step >= kill_at:
            trainer = json.loads((out / "processes.json").read_text())["trainer-0"]
            os.kill(trainer["pid"], signal.SIGKILL)
            killed_step, marks["killed"] = step, now
        if killed_step is not None and "restarted" not in marks and step > killed_step:
            marks["restarted"] = now  # (a resumed attempt redoes steps past its checkpoint)
        if step >= steps and "trained" not in marks:
            marks["trained"] = now
        time.sleep(0.05)
    marks["exited"] = time.monotonic() - begun
    if proc.returncode != 0:
        raise SystemExit(f"the run failed ({proc.returncode}); see {out}/logs")
    return marks


def import_seconds(module: str) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--kill-at", type=int, default=3, help="0: no kill")
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--compare-kv", action="store_true", help="sized KV cache against 1 GiB")
    args = parser.parse_args()
    if args.compare_kv:
        compare_kv(args.steps, args.generators)
        return
    with tempfile.TemporaryDirectory(prefix="start-bench-") as tmp:
        marks = timed_run(Path(tmp), args.steps, args.kill_at or None, args.generators)
    imports = import_seconds("scalerl.trainer.main") + import_seconds(
        "scalerl.generator.main, vllm.v1.engine.async_llm"
    )
    start = marks["evaluated"] - marks["launched"]
    print(f"checks   {marks['launched']:6.1f} s")
    print(f"start    {start:6.1f} s")
    print(f"steps    {marks['trained'] - marks['evaluated']:6.1f} s")
    if "restarted" in marks:
        print(f"restart  {marks['restarted'] - marks['killed']:6.1f} s")
    print(f"stop     {marks['exited'] - marks['trained']:6.1f} s")
    print(f"imports  {imports:6.1f} s (trainer + one generator, one after the other)")
    print(f"start / imports = {start / imports:.2f}")


def compare_kv(steps: int, generators: int) -> None:
    starts = {}
    for name, env in (("sized", {}), ("1 GiB", {"VLLM_CPU_KVCACHE_SPACE": "1"})):
        with tempfile.TemporaryDirectory(prefix="start-bench-") as tmp:
            marks = timed_run(Path(tmp), steps, None, generators, env)
        starts[name] = marks["evaluated"] - marks["launched"]
        print(
            f"KV cache {name:6}: start {starts[name]:5.1f} s, generators' CPU by the step-0 "
            f"evaluation {marks['generator_cpu']:5.1f} s"
        )
    print(f"start, sized / 1 GiB = {starts['sized'] / starts['1 GiB']:.2f}")


if __name__ == "__main__":
    main()
