"""PipelineRL-8 against PPO-off-policy-1 on the demo task, in one run: generated samples per second,
generator idle fraction and trainer steps per second.

Both runs use examples/local.yaml with only `recipe.algorithm` / `maxOffPolicySteps` changed and a
fixed number of steps (evaluations only at the start and the end, so they do not dominate).

    .venv/bin/python bench/pipeline_bench.py [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from scalerl.runfile import run_command, write_variant
from scalerl.spec import load_run

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "local.yaml"
MODES = {
    "PipelineRL-8": {"algorithm": "pipelinerl", "maxOffPolicySteps": 8},
    "PPO-off-policy-1": {"algorithm": "ppo-off-policy", "maxOffPolicySteps": 1},
}


def run_mode(name: str, recipe: dict[str, object], steps: int, work: Path) -> dict[str, float]:
    fixed = {
        "budget": {"maxSteps": steps},
        "evaluation": {"everySteps": steps},
        "checkpoint": {"everySteps": steps},
    }
    path = write_variant(EXAMPLE, work / f"{name}.yaml", {"recipe": recipe}, fixed)
    out = work / name
    started = time.monotonic()
    subprocess.run(run_command(path, out), check=True, capture_output=True)
    total = time.monotonic() - started
    last = [json.loads(x) for x in (out / "history.jsonl").read_text().splitlines()][-1]
    units = load_run(path).spec.generators.replicas + 1
    train_wall = last["compute"] * 3600 / units  # training only: no start-up, no evaluations
    generation = last["generation"]
    uptime = generation["generation_seconds"]
    return {
        "samples_per_s": generation["generated_samples"] / uptime,
        "idle_fraction": generation["generator_idle_seconds"] / uptime,
        "steps_per_s": last["step"] / train_wall,
        "pass_rate": last["pass_rate"],
        "wall_s": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="scalerl-bench-") as tmp:
        for name, recipe in MODES.items():
            results[name] = run_mode(name, recipe, args.steps, Path(tmp))
    print(
        f"{'mode':<18} {'samples/s':>10} {'idle':>7} {'steps/s':>8} {'eval pass':>10} {'wall s':>7}"
    )
    for name, r in results.items():
        print(
            f"{name:<18} {r['samples_per_s']:>10.1f} {r['idle_fraction']:>7.1%} "
            f"{r['steps_per_s']:>8.3f} {r['pass_rate']:>10.3f} {r['wall_s']:>7.0f}"
        )
    pipe, ppo = results["PipelineRL-8"], results["PPO-off-policy-1"]
    for key in ("samples_per_s", "steps_per_s"):
        print(f"{key} ratio PipelineRL-8 / PPO-off-policy-1: {pipe[key] / ppo[key]:.2f}")


if __name__ == "__main__":
    main()
