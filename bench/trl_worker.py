"""TRL's side of bench/trl_bench.py, run in its own process: GRPOTrainer with the spec's recipe
(bench/trl_bench.py's doc lists the mapping), the callback that evaluates and keeps its clocks,
and the record it writes. bench/trl_env_bench.py's worker uses the same pieces."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from trl_shared import eval_seed, point, reached

from scalerl.spec import RunSpec


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
