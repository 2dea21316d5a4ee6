"""Train-inference mismatch of an unchanged policy: what vLLM records against what the trainer
computes for the same tokens, per precision and per sampling setting.

A tiny random Llama whose head is scaled so that a few tokens carry most of the probability (as
in a trained model) is sampled by the real vLLM engine (CPU), and the trainer's own `Policy`
scores every sampled token with the run's settings; the figures are the run's own
(`scalerl.recipe.mismatch`, lag 0: the same weights on both sides). Rows:

- float32: both engines in float32 (the floor: float error alone);
- bf16: model body and head in bf16 on both sides;
- bf16 + FP32 head: the paper's FP32 LM head on both sides (`model.fp32LMHead`);
- then bf16 + FP32 head under each sampling setting (temperature, top-p, top-k, min-p), scored
  with the setting (what runs do) and, for contrast, without it (a trainer that ignored it).

    .venv/bin/python bench/mismatch_bench.py [--prompts 16] [--samples 8] [--tokens 48]

Prints one row per setting: tokens, KL (k3), mean and max |Δ log p|, and the share of tokens
whose ratio leaves [0.8, 1.25]; and the ratio of each KL to the float32 floor measured in the
same run.

`--run` measures the FP32 head's effect on a short run instead: the demo (examples/local.yaml) in
bf16 with and without `fp32LMHead`, PPO-off-policy-1 (every token of lag 0: mismatch alone),
`--steps` steps; prints each run's lag-0 mismatch at its evaluations (history.jsonl) and its
held-out pass rate at the start and the end.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from scalerl.demo.model import TinyModelShape, build_random_model
from scalerl.generator.engine import DEFAULT_PHRASE, EngineConfig, GenerationEngine
from scalerl.recipe import InterruptionPlan
from scalerl.recipe.mismatch import LagFigures, figures, mismatch_sums
from scalerl.recipe.sampling import NO_FILTERS, SamplingFilters
from scalerl.rollout.records import RolloutGroup, Sample
from scalerl.runfile import run_command, write_variant
from scalerl.status.history import read_history
from scalerl.trainer import build_batch, load_policy

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

SHAPE = TinyModelShape(hidden=256, layers=2, heads=4, intermediate=512)
DTYPES = (torch.float32, torch.bfloat16)
HEAD_SCALE = 16.0  # logits spread as a trained model's: a few tokens carry most of the mass
SETTINGS: dict[str, tuple[float, SamplingFilters]] = {
    "temperature 0.7": (0.7, NO_FILTERS),
    "top-p 0.9": (1.0, SamplingFilters(top_p=0.9)),
    "top-k 5": (1.0, SamplingFilters(top_k=5)),
    "min-p 0.05": (1.0, SamplingFilters(min_p=0.05)),
}


def build_model(root: Path, dtype: torch.dtype) -> Path:
    """The same random weights in `dtype`, the head scaled."""
    from transformers import AutoModelForCausalLM

    path = build_random_model(root / str(dtype).removeprefix("torch."), shape=SHAPE, seed=7)
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.to(dtype).save_pretrained(str(path), safe_serialization=True)
    return path


async def sample(
    config: EngineConfig, settings: list[tuple[float, SamplingFilters]], args: argparse.Namespace
) -> list[tuple[list[list[int]], list[list[Sample]]]]:
    """For each (temperature, filters): the prompts and what one engine sampled for them."""
    engine = GenerationEngine(config)
    await engine.start()
    out = []
    try:
        for temperature, filters in settings:
            # The engine reads its sampling settings per request.
            engine.config = dataclasses.replace(config, temperature=temperature, filters=filters)
            prompts = [[1, *range(10 + 3 * i, 22 + 3 * i)] for i in range(args.prompts)]
            groups = [
                await engine.generate(p, args.samples, max_tokens=args.tokens) for p in prompts
            ]
            out.append((prompts, groups))
    finally:
        await engine.shutdown()
    return out


def score(
    config: EngineConfig,
    prompts: list[list[int]],
    groups: list[list[Sample]],
    temperature: float,
    filters: SamplingFilters,
) -> LagFigures:
    """The lag-0 mismatch figures of every sampled token, the trainer scoring with `temperature`
    and `filters` in the engine's precision."""
    policy = load_policy(
        config.model_path,
        dtype=config.dtype,
        fp32_lm_head=config.fp32_lm_head,
        temperature=temperature,
        filters=filters,
    )
    rollouts = [
        RolloutGroup(f"p{i}", p, [dataclasses.replace(s, truncated=False) for s in g], 0)
        for i, (p, g) in enumerate(zip(prompts, groups, strict=True))
    ]
    batch, _ = build_batch(
        rollouts, current_version=0, max_off_policy=None, pad_id=policy.pad_id,
        drop_zero_variance=False,
    )  # fmt: skip
    assert batch is not None
    with torch.no_grad():
        logprobs, _ = policy.completion_logprobs(batch)
    return figures(mismatch_sums(logprobs, batch.old_logprobs, batch.loss_mask, batch.lags))[0]


def row(name: str, f: LagFigures, floor: float) -> str:
    return (
        f"{name:<34} {f.tokens:>6} {f.kl:>10.2e} {f.abs_mean:>10.2e} {f.abs_max:>9.2e}"
        f" {f.outside:>8.2%} {f.kl / floor if floor > 0 else float('inf'):>10.3g}"
    )


def short_runs(steps: int) -> None:
    """The demo in bf16 with and without the FP32 head: lag-0 mismatch and pass rate."""
    print(f"{'run':<24} {'lag-0 KL at evaluations':<44} {'|Δ| max':>9} {'pass rate':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for fp32_head in (False, True):
            changes = {
                "model": {"dtype": "bfloat16", "fp32LMHead": fp32_head},
                "recipe": {"algorithm": "ppo-off-policy", "maxOffPolicySteps": 1},
                "generators": {"replicas": 1},
                "evaluation": {"everySteps": max(1, steps // 4)},
                "budget": {"maxSteps": steps},
            }
            spec = write_variant(EXAMPLES / "local.yaml", Path(tmp) / f"{fp32_head}.yaml", changes)
            out = Path(tmp) / f"run-{fp32_head}"
            subprocess.run(run_command(spec, out), check=True, capture_output=True)
            history = read_history(out / "history.jsonl")
            # An evaluation after a step with nothing to learn has no figures.
            lag0 = [r["train_mismatch_by_lag"]["0"] for r in history if r["train_mismatch_by_lag"]]
            kls = " ".join(f"{f['kl']:.1e}" for f in lag0)
            rates = f"{history[0]['pass_rate']:.2f} -> {history[-1]['pass_rate']:.2f}"
            name = "bf16 + FP32 head" if fp32_head else "bf16"
            print(f"{name:<24} {kls:<44} {max(f['abs_max'] for f in lag0):>9.3f} {rates:>14}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--run", action="store_true", help="the FP32 head on a short run")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if args.run:
        short_runs(args.steps)
        return
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = {str(d).removeprefix("torch."): build_model(root, d) for d in DTYPES}
        base = EngineConfig(
            model_path=str(paths["float32"]),
            dtype="float32",
            fp32_lm_head=False,
            max_model_len=256,
            temperature=1.0,
            seed=0,
            phrase=DEFAULT_PHRASE,
            plan=InterruptionPlan(thinking_budget=args.tokens, answer_budget=8, window=(8, 16)),
            run_dir=str(root / "run"),
        )
        precisions = {
            "float32": base,
            "bf16": dataclasses.replace(base, model_path=str(paths["bfloat16"]), dtype="bfloat16"),
            "bf16 + FP32 head": dataclasses.replace(
                base, model_path=str(paths["bfloat16"]), dtype="bfloat16", fp32_lm_head=True
            ),
        }
        rows: list[tuple[str, LagFigures]] = []
        for name, config in precisions.items():
            settings = [(1.0, NO_FILTERS)]
            if name == "bf16 + FP32 head":
                settings += list(SETTINGS.values())
            sampled = asyncio.run(sample(config, settings, args))
            (prompts, groups), *others = sampled
            rows.append((name, score(config, prompts, groups, 1.0, NO_FILTERS)))
            for (setting, (temperature, filters)), (prompts, groups) in zip(
                list(SETTINGS.items())[: len(others)], others, strict=True
            ):
                matched = score(config, prompts, groups, temperature, filters)
                # A trainer ignoring the setting: no filters, or no temperature.
                ignored = temperature if filters.on else 1.0
                naive = score(config, prompts, groups, ignored, NO_FILTERS)
                rows.append((f"{name}, {setting}", matched))
                rows.append((f"  trainer ignoring {setting}", naive))
    floor = rows[0][1].kl
    print(
        f"{'setting':<34} {'tokens':>6} {'KL':>10} {'|Δ| mean':>10} {'|Δ| max':>9}"
        f" {'outside':>8} {'KL/float32':>10}"
    )
    for name, f in rows:
        print(row(name, f, floor))


if __name__ == "__main__":
    main()
