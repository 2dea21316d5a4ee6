"""Where a step's wall time goes: the demo run (examples/local.yaml, or with `--placement colocated`
examples/colocated.yaml) for a fixed number of steps, then its profile from the last evaluation of
`history.jsonl`.

Trainer 0's side: waiting for rollouts, building the batch, forward/backward, the optimizer, the
weight broadcast, evaluation, checkpoints and the rest. The generators' side (averaged over
them): generating, idle (no group in flight: waiting for a new version or for quota), weight
updates, scoring and backpressure (rollouts ready, the trainer not reading). Colocated, the
"broadcast" is the in-memory load, and "waiting for rollouts" is the engine generating.

    .venv/bin/python bench/step_profile.py [--steps 30] [--algorithm pipelinerl]
                                           [--placement disaggregated|colocated]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from scalerl.runfile import run_command, write_variant
from scalerl.trainer.profile import PHASES

ROOT = Path(__file__).resolve().parents[1]
GENERATOR_PARTS = ("idle", "weight_sync", "score", "send_wait")


EXAMPLES = {"disaggregated": "local.yaml", "colocated": "colocated.yaml"}


def profile(steps: int, algorithm: str, placement: str, work: Path) -> dict[str, Any]:
    changes = {
        "recipe": {"algorithm": algorithm},
        "budget": {"maxSteps": steps},
        "evaluation": {"everySteps": steps},  # at the start and at the end only
        "checkpoint": {"everySteps": steps},
    }
    path = write_variant(ROOT / "examples" / EXAMPLES[placement], work / "run.yaml", changes)
    out = work / "run"
    subprocess.run(run_command(path, out), check=True, capture_output=True)
    history = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()]
    return history[-1]


def table(last: dict[str, Any]) -> list[str]:
    steps = max(int(last["step"]), 1)
    trainer, generation = last["trainer_seconds"], last["generation"]
    wall = trainer["wall"]
    running = wall - trainer["start"]
    lines = [
        f"trainer 0: {wall:.1f} s, of which {running:.1f} s for {steps} steps after start-up "
        f"({running / steps:.2f} s/step)"
    ]
    lines.append(f"  {'phase':<18} {'seconds':>8} {'s/step':>7} {'share':>6}")
    for phase in (*PHASES, "other"):
        seconds = trainer[phase]
        share = seconds / wall
        lines.append(f"  {phase:<18} {seconds:>8.1f} {seconds / steps:>7.3f} {share:>6.1%}")
    uptime = generation["generation_seconds"]
    lines.append(f"generators (mean of each): {uptime:.1f} s up")
    busy = uptime - generation["generator_idle_seconds"]
    lines.append(f"  {'generating':<18} {busy:>8.1f} {busy / steps:>7.3f} {busy / uptime:>6.1%}")
    for part in GENERATOR_PARTS:
        seconds = generation[f"generator_{part}_seconds"]
        lines.append(
            f"  {part:<18} {seconds:>8.1f} {seconds / steps:>7.3f} {seconds / uptime:>6.1%}"
        )
    rate = generation["generated_samples"] / uptime
    lines.append(f"samples generated/s {rate:.1f}; held-out pass rate {last['pass_rate']:.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--algorithm", default="pipelinerl", choices=["pipelinerl", "ppo-off-policy"]
    )
    parser.add_argument("--placement", default="disaggregated", choices=sorted(EXAMPLES))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        last = profile(args.steps, args.algorithm, args.placement, Path(tmp))
    print(f"{args.placement}, {args.algorithm}, {args.steps} steps")
    print("\n".join(table(last)))


if __name__ == "__main__":
    main()
