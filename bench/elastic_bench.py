"""What one process failure costs a run: a generator's, replaced alone while the trainer trains on
(elastic), against a gang restart from the last checkpoint (what any failure cost before, and
what a trainer's still costs), in the same demo-shaped run.

Three runs of examples/local.yaml (one trainer, two vLLM generators), `--steps` steps with a
checkpoint every `--checkpoint`: undisturbed; generator-1 killed (SIGKILL) at step `--kill-at`;
trainer-0 killed at that step. Per run it prints the wall seconds, the seconds lost against the
undisturbed run, the steps trained twice (the kill's step less the checkpoint it resumed from),
the steps trained with a generator missing, gang restarts and replacements; then seconds lost,
gang restart / elastic.

    .venv/bin/python bench/elastic_bench.py [--steps 150] [--kill-at 27] [--checkpoint 10]
"""

from __future__ import annotations

import argparse
import json
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
    killed_at: int | None  # the step the run had reached when the process was killed
    trained_twice: int  # steps between the checkpoint a restart resumed from and the kill
    degraded_steps: int  # steps trained between a generator's loss and its replacement's join
    restarts: int
    replacements: int
    pass_rate: float


def run(spec: Path, out: Path, kill: str | None, kill_at: int) -> Outcome:
    started = time.monotonic()
    proc = subprocess.Popen(
        run_command(spec, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    killed_at = None
    try:
        if kill is not None:
            while step_of(out) < kill_at:
                if proc.poll() is not None:
                    raise SystemExit(
                        f"the run ended before step {kill_at}:\n{proc.communicate()[0]}"
                    )
                time.sleep(0.05)
            killed_at = step_of(out)
            pid = json.loads((out / "processes.json").read_text())[kill]["pid"]
            os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=1800)
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
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--kill-at", type=int, default=27)
    parser.add_argument("--checkpoint", type=int, default=10)
    args = parser.parse_args()
    shape = {
        "recipe": {"batch": {"prompts": 8, "generationsPerPrompt": 4}},
        "data": {"validation": {"prompts": 32}},
        "evaluation": {"everySteps": 25, "generationsPerPrompt": 2},
        "budget": {"maxSteps": args.steps},
        "checkpoint": {"everySteps": args.checkpoint},
    }
    cases = {"undisturbed": None, "elastic": "generator-1", "gang restart": "trainer-0"}
    results = {}
    with tempfile.TemporaryDirectory(prefix="scalerl-elastic-") as tmp:
        spec = write_variant(EXAMPLE, Path(tmp) / "run.yaml", shape)
        for name, role in cases.items():
            results[name] = run(spec, Path(tmp) / name.replace(" ", "-"), role, args.kill_at)
    base = results["undisturbed"].wall_s
    print(
        f"{'run':<13} {'wall s':>7} {'lost s':>7} {'killed at':>9} {'twice':>6} "
        f"{'degraded':>9} {'restarts':>9} {'replaced':>9} {'pass':>6}"
    )
    for name, r in results.items():
        print(
            f"{name:<13} {r.wall_s:>7.1f} {r.wall_s - base:>7.1f} {r.killed_at or '-':>9} "
            f"{r.trained_twice:>6} {r.degraded_steps:>9} {r.restarts:>9} {r.replacements:>9} "
            f"{r.pass_rate:>6.3f}"
        )
    elastic, gang = results["elastic"].wall_s - base, results["gang restart"].wall_s - base
    if elastic > 0:
        print(f"seconds lost, gang restart / elastic: {gang / elastic:.2f}")
    else:
        print(f"seconds lost: gang restart {gang:.1f}, elastic {elastic:.1f} (none measurable)")


if __name__ == "__main__":
    main()
