"""Why did a small model oscillate at lr 3e-4? The chat-arith example at TRL's settings (lr 3e-4,
no warm-up, batch 16x8), once per recipe variant, on the same machine in one run.

Each variant changes one thing against the paper's PipelineRL-8: the policy lag (PipelineRL-1),
gradient clipping at 1.0 (TRL's default), the learning rate (1e-4). For each it prints the
held-out pass-rate curve, its final value, the largest fall from a running peak (how much was
learnt and then lost), the mean |change| between evaluations (oscillation), and the largest
importance ratio and gradient norm seen at evaluations; then `scalerl compare` of each variant
against the baseline (the paper's rule: same A within 0.02, then compare B).

    .venv/bin/python bench/stability_bench.py [--steps 120] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scalerl.runfile import run_command, write_variant
from scalerl.status.history import read_history

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "chat-arith.yaml"
# The settings the oscillation shows at: no gradient clipping (the default clips at 1.0; the clip
# variant measures that against them).
TRL_LIKE = {
    "optimizer": {"lr": 3e-4, "warmupSteps": 0, "maxGradNorm": None},
    "batch": {"prompts": 16},
}
VARIANTS: dict[str, dict[str, Any]] = {
    "pipelinerl-8": {"maxOffPolicySteps": 8},
    "pipelinerl-1": {"maxOffPolicySteps": 1},
    "pipelinerl-8+clip1": {"maxOffPolicySteps": 8, "optimizer": {"maxGradNorm": 1.0}},
    "pipelinerl-8@1e-4": {"maxOffPolicySteps": 8, "optimizer": {"lr": 1e-4}},
}
BASELINE = "pipelinerl-8"


def run_variant(name: str, steps: int, work: Path) -> tuple[Path, float]:
    length = {
        "budget": {"maxSteps": steps, "maxComputeHours": 10.0},
        "checkpoint": {"everySteps": steps},
    }
    recipes = {"recipe": TRL_LIKE}, {"recipe": VARIANTS[name]}
    path = write_variant(EXAMPLE, work / f"{name}.yaml", *recipes, length)
    out = work / name
    started = time.monotonic()
    subprocess.run(run_command(path, out), check=True, capture_output=True)
    return out / "history.jsonl", time.monotonic() - started


def summary(history: Path) -> dict[str, Any]:
    evals = read_history(history)
    rates = [e["pass_rate"] for e in evals]
    peak, drawdown = rates[0], 0.0
    for rate in rates:
        peak = max(peak, rate)
        drawdown = max(drawdown, peak - rate)
    moves = [abs(b - a) for a, b in zip(rates, rates[1:], strict=False)]
    return {
        "curve": " ".join(f"{r:.2f}" for r in rates),
        "start": rates[0],
        "final": rates[-1],
        "drawdown": drawdown,
        "mean_move": sum(moves) / max(len(moves), 1),
        "ratio_max": max(e["train_ratio_max"] or 0.0 for e in evals[1:]),
        "grad_norm_max": max(e["train_grad_norm"] or 0.0 for e in evals[1:]),
    }


def verdict(base: Path, other: Path) -> str:
    """What `scalerl compare` says, as a user would run it."""
    result = subprocess.run(
        [sys.executable, "-m", "scalerl.cli", "compare", str(base), str(other)]
        + ["--min-compute", "0"],
        capture_output=True,
        text=True,
    )
    return (result.stdout + result.stderr).strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--only", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stability-") as tmp:
        work = Path(tmp)
        histories: dict[str, Path] = {}
        for name in args.only:
            histories[name], wall = run_variant(name, args.steps, work)
            s = summary(histories[name])
            print(f"{name:20} {wall:5.0f} s  held-out pass rate by evaluation: {s['curve']}")
            print(
                f"{'':20} start {s['start']:.3f}  final {s['final']:.3f}  "
                f"largest fall from a peak {s['drawdown']:.3f}  mean |change| "
                f"{s['mean_move']:.3f}  max ratio {s['ratio_max']:.2f}  "
                f"max grad norm {s['grad_norm_max']:.2f}",
                flush=True,
            )
        if BASELINE in histories:
            for name, history in histories.items():
                if name != BASELINE:
                    print(f"\nscalerl compare {BASELINE} {name}:")
                    print(verdict(histories[BASELINE], history))


if __name__ == "__main__":
    main()
