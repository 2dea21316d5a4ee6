"""What one process failure costs a run: a generator's, replaced alone while the trainer trains on
(elastic), against a gang restart from the last checkpoint (what any failure cost before, and
what a trainer's still costs), in the same demo-shaped run.

Four runs of examples/local.yaml (one trainer, two vLLM generators), `--steps` steps with a
checkpoint every `--checkpoint`: undisturbed; generator-1 killed (SIGKILL) at step `--kill-at`;
trainer-0 killed at that step; and chaos: a generator killed every `--chaos-every` steps through
the whole run (generator-1, then generator-0, in turn; each once its predecessor's replacement
joined). Per run it prints the wall seconds, the seconds lost against the undisturbed run, the
steps trained twice (the kill's step less the checkpoint it resumed from), the steps trained
with a generator missing, gang restarts and replacements, and the final held-out pass rate with
its standard error; then seconds lost, gang restart / elastic, and how far chaos's pass rate is
from the undisturbed run's in standard errors of their difference.

    .venv/bin/python bench/elastic_bench.py [--steps 150] [--kill-at 27] [--checkpoint 10]
        [--chaos-every 20]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from start_bench import step_of

from scalerl.runfile import run_command, write_variant

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "local.yaml"


@dataclass
class Outcome:
    wall_s: float
    killed_at: int | None  # the step the run had reached when the (first) process was killed
    trained_twice: int  # steps between the checkpoint a restart resumed from and the kill
    degraded_steps: int  # steps trained between a generator's loss and its replacement's join
    restarts: int
    replacements: int
    pass_rate: float
    pass_rate_se: float
    kills: int = 0


def pid_of(out: Path, role: str) -> int:
    return int(json.loads((out / "processes.json").read_text())[role]["pid"])


def joins(out: Path) -> int:
    """Replacements the trainer let into the weight-sync group so far."""
    log = out / "logs" / "trainer-0.log"
    return log.read_text().count("joins the weight-sync group") if log.exists() else 0


def run(spec: Path, out: Path, kills: list[tuple[str, int]]) -> Outcome:
    """The run of `spec` in `out`, each (role, step) of `kills` killed (SIGKILL) once the run
    reached that step and every earlier kill's replacement joined the weight-sync group."""
    started = time.monotonic()
    proc = subprocess.Popen(
        run_command(spec, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    killed_at: int | None = None
    killed = 0
    try:
        for role, at in kills:
            while step_of(out) < at or joins(out) < killed:
                if proc.poll() is not None:
                    if not killed:
                        raise SystemExit(
                            f"the run ended before step {at}:\n{proc.communicate()[0]}"
                        )
                    break
                time.sleep(0.05)
            if proc.poll() is not None:
                break
            killed_at = step_of(out) if killed_at is None else killed_at
            os.kill(pid_of(out, role), signal.SIGKILL)
            killed += 1
        output, _ = proc.communicate(timeout=3600)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise SystemExit(f"the run failed:\n{output}")
    wall = time.monotonic() - started
    log = (out / "logs" / "trainer-0.log").read_text()
    resumed = [int(s) for s in re.findall(r"resumed from \S+ \(step (\d+)\)", log)]
    lost = [int(s) for s in re.findall(r"generator \d+ lost at step (\d+)", log)]
    joined = [
        int(s) for s in re.findall(r"generator \d+ joins the weight-sync group at step (\d+)", log)
    ]
    last = json.loads((out / "history.jsonl").read_text().splitlines()[-1])
    return Outcome(
        wall_s=wall,
        killed_at=killed_at,
        trained_twice=(killed_at - resumed[0]) if resumed and killed_at is not None else 0,
        degraded_steps=sum(j - s for s, j in zip(lost, joined, strict=False)),
        restarts=output.count("restarting from the last checkpoint"),
        replacements=output.count("starting a replacement"),
        pass_rate=last["pass_rate"],
        pass_rate_se=last["pass_rate_se"],
        kills=killed,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--kill-at", type=int, default=27)
    parser.add_argument("--checkpoint", type=int, default=10)
    parser.add_argument("--chaos-every", type=int, default=20)
    args = parser.parse_args()
    shape = {
        "recipe": {"batch": {"prompts": 8, "generationsPerPrompt": 4}},
        "data": {"validation": {"prompts": 32}},
        "evaluation": {"everySteps": 25, "generationsPerPrompt": 2},
        "budget": {"maxSteps": args.steps},
        "checkpoint": {"everySteps": args.checkpoint},
    }
    every = args.chaos_every
    chaos = [(f"generator-{1 - i % 2}", at) for i, at in enumerate(range(every, args.steps, every))]
    cases = {
        "undisturbed": [],
        "elastic": [("generator-1", args.kill_at)],
        "gang restart": [("trainer-0", args.kill_at)],
        "chaos": chaos,
    }
    results = {}
    with tempfile.TemporaryDirectory(prefix="scalerl-elastic-") as tmp:
        spec = write_variant(EXAMPLE, Path(tmp) / "run.yaml", shape)
        for name, kills in cases.items():
            results[name] = run(spec, Path(tmp) / name.replace(" ", "-"), kills)
    base = results["undisturbed"].wall_s
    print(
        f"{'run':<13} {'wall s':>7} {'lost s':>7} {'killed at':>9} {'kills':>6} {'twice':>6} "
        f"{'degraded':>9} {'restarts':>9} {'replaced':>9} {'pass':>6} {'± SE':>6}"
    )
    for name, r in results.items():
        print(
            f"{name:<13} {r.wall_s:>7.1f} {r.wall_s - base:>7.1f} {r.killed_at or '-':>9} "
            f"{r.kills:>6} {r.trained_twice:>6} {r.degraded_steps:>9} {r.restarts:>9} "
            f"{r.replacements:>9} {r.pass_rate:>6.3f} {r.pass_rate_se:>6.3f}"
        )
    calm, rough = results["undisturbed"], results["chaos"]
    z = (rough.pass_rate - calm.pass_rate) / math.hypot(calm.pass_rate_se, rough.pass_rate_se)
    moved = rough.pass_rate - calm.pass_rate
    print(f"chaos against undisturbed: pass rate {moved:+.3f} ({z:+.1f} SE of the difference)")
    elastic, gang = results["elastic"].wall_s - base, results["gang restart"].wall_s - base
    if elastic > 0:
        print(f"seconds lost, gang restart / elastic: {gang / elastic:.2f}")
    else:
        print(f"seconds lost: gang restart {gang:.1f}, elastic {elastic:.1f} (none measurable)")


if __name__ == "__main__":
    main()
