"""`bench/trl_bench.py --env`: the tool task with TRL's `GRPOTrainer(environment_factory=...)`
against scalerl colocated and disaggregated.

    .venv/bin/pip install -e '.[bench]'                        # TRL, pinned
    .venv/bin/pip install --no-deps -e environments/tool_arith  # the environment, as a user would
    .venv/bin/python bench/trl_bench.py --env [--spec examples/tool-env.yaml] [--cap-minutes 10]
                                        [--only trl|colocated|disaggregated] [--repeats R] ...

Everything but TRL's worker is trl_bench.py's (its docstring says how the systems are run,
clocked and stopped, and what the table means): ours is `scalerl run` on the spec (rollouts
through the environment's verifiers loop on vLLM, PipelineRL-k), its checkpoints evaluated
afterwards; TRL trains in a subprocess and is evaluated in its callback. One evaluator for all
three: `scalerl.hfeval`'s environment path (`scalerl.hfeval_env`), which plays each of the
environment's held-out prompts `evaluation.generationsPerPrompt` times through the same verifiers
loop with every model turn sampled by Hugging Face `generate`, seeded by spec.seed + 1000 + step,
so at step 0 all three read the same base model with the same seed and start from the same pass
rate exactly. A rollout passes at reward >= environment.passThreshold, not truncated.

TRL's side, from the same spec (`examples/tool-env.yaml`: `builtin:tool-arith`, the `tool-arith`
verifiers environment):
  - model: the same folder; its tokenizer's `response_template` (scalerl.demo.tool_chat) is how
    TRL parses `<tool_call>{json}</tool_call>` turns into tool calls;
  - prompts: the environment's train split as our generators read it (its system and user
    messages), rendered by TRL with the tool's schema: checked, before training, to be the very
    token ids our generators send for the first turn;
  - tools: `environment_factory=Calculator`, one instance per rollout, whose `calculate` calls the
    installed `tool_arith.calculate` (the environment's own tool, not a copy); an exception is a
    tool error message to the model, as in verifiers;
  - reward: the environment's rubric rule, `tool_arith.correct_answer` on TRL's completion
    messages (1.0 when the last assistant message, stripped, is the product);
  - max_tool_calling_iterations = environment.maxTurns - 1 (so at most maxTurns model turns);
  - batch, group size, learning rate, warm-up, optimizer, temperature, cispo with epsilonMax,
    max_completion_length = the completion budget (answerBudget): trl_bench.py's mapping.

What TRL cannot match, beyond what trl_bench.py lists (synchronous on-policy GRPO against our
PipelineRL-k, token-level cispo normalization, reward-std scaling, no zero-variance filtering or
no-positive-resampling):
  - TRL's `max_completion_length` counts the tool's tokens too (a tool result that would pass it
    is dropped and the rollout ends there); ours counts only the model's tokens over all turns
    (answerBudget), the environment's are outside every budget but the model's context;
  - TRL renders the tool's result as its own `{"role": "tool", "name": ..., "content": ...}`
    message; verifiers' ToolEnv as its own (the same template: the same tokens for a result);
    an exception reads `{'error': ...}` in TRL and verifiers' error text in ours;
  - TRL aligns a tool result on the tokenizer's eos_token, which it takes to end a turn:
    builtin:tool-arith's is <|endoftext|> and its turns end with <|end|>, so the worker makes
    <|end|> the eos_token (`end_turn_as_eos`): without it TRL drops the newline after every
    tool call, and the model, which never saw that context, copies the tool's result badly
    (measured: TRL's training reward 0.06 against a held-out pass rate of 0.26);
  - TRL parses tool calls with the tokenizer's response_template (transformers), ours with
    scalerl.agents.toolcalls: both read the JSON between the tags; a malformed call is plain text
    to TRL, a tool error to verifiers;
  - TRL's evaluator runs in its callback on the model in memory, ours on saved checkpoints.
"""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path
from typing import Any

ENVIRONMENT_ID = "tool-arith"


class Calculator:
    """TRL's environment: one per rollout; its public method is the tool the model calls."""

    def reset(self, **_: Any) -> None:
        """Nothing to reset: the calculator keeps no state between calls."""
        return None

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression, e.g. "37*48".

        Args:
            expression: numbers joined by + - * / // % with parentheses.
        """
        import tool_arith

        return str(tool_arith.calculate(expression))


def trl_env_worker(spec_file: Path, result_file: Path, cap_s: float, gain: float) -> None:
    """Train the tool task with TRL's GRPOTrainer and `environment_factory` until +gain
    (confirmed) or the cap; write the figures (trl_worker.py's record)."""
    spawned = float(os.environ.get("TRL_BENCH_SPAWNED") or time.time())
    import datasets
    import tool_arith
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    from trl_worker import clock_callback, finish_record, grpo_config, new_record, peft_config

    from scalerl.agents.load import environment_examples, load_environment
    from scalerl.hfeval import load_spec
    from scalerl.hfeval_env import AgentHeldOut

    run = load_spec(spec_file)
    spec = run.spec
    environment = spec.environment
    if environment is None or environment.verifiers is None:
        raise SystemExit("--env needs a spec with spec.environment.verifiers (tool-arith)")
    if environment.verifiers.id != ENVIRONMENT_ID:
        raise SystemExit(f"--env benches the {ENVIRONMENT_ID} environment, not {environment}")
    path = spec.model.path
    tokenizer = AutoTokenizer.from_pretrained(path)
    if getattr(tokenizer, "response_template", None) is None:
        raise SystemExit(f"{path}: its tokenizer has no response_template for TRL to parse")
    end_turn_as_eos(tokenizer, path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    env = load_environment(spec)
    train, _ = environment_examples(env, spec)
    held = AgentHeldOut.for_run(run, tokenizer, path)
    dataset = datasets.Dataset.from_list(
        [{"prompt": prompt_messages(e), "answer": e.answer} for e in train]
    )
    check_first_context(env, tokenizer, train[0])

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [
            float(tool_arith.correct_answer(c, a)) for c, a in zip(completions, answer, strict=True)
        ]

    record = new_record(held, spec)
    record["max_tool_calling_iterations"] = environment.max_turns - 1
    clock = clock_callback(held, spec, record, cap_s, gain, spawned)
    config = grpo_config(
        spec,
        result_file.parent / "trl-out",
        max_tool_calling_iterations=environment.max_turns - 1,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
        peft_config=peft_config(spec, model),
        environment_factory=Calculator,
    )
    check_tool_suffix(trainer, tokenizer)
    clock.trainer = trainer
    trainer.train()
    finish_record(record, spec, result_file)


def end_turn_as_eos(tokenizer: Any, model_path: str) -> None:
    """Make the token that ends a turn the tokenizer's eos_token, where the model's generation
    config names one besides it. TRL cuts the template's rendering of a tool result at the
    eos_token to append it after the model's turn; builtin:tool-arith's eos_token is
    <|endoftext|> while its turns end with <|end|> + newline, so TRL would otherwise drop the
    newline after each tool call: a context our generators never produce."""
    from transformers import GenerationConfig

    ids = GenerationConfig.from_pretrained(model_path).eos_token_id
    others = [
        i for i in ([ids] if isinstance(ids, int) else ids or []) if i != tokenizer.eos_token_id
    ]
    if len(others) == 1:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(others[0])


def prompt_messages(example: Any) -> list[dict[str, Any]]:
    """The example's first messages (the environment's system prompt and the question) as chat
    message dicts, as our generators render them."""
    from verifiers.utils.message_utils import normalize_messages

    from scalerl.agents.client import chat_message

    prompt = (example.inputs or {}).get("prompt") or []
    return [chat_message(m) for m in normalize_messages(prompt, field_name="prompt")]


def check_first_context(env: Any, tokenizer: Any, example: Any) -> None:
    """Stop unless TRL would render the first turn's context to the ids our generators send
    (TRL renders conversational prompts with the environment's methods as tools)."""
    from scalerl.agents.rollouts import first_context

    ours = first_context(env, tokenizer, example)
    tools = [
        getattr(Calculator(), name)
        for name, _ in inspect.getmembers(Calculator, inspect.isfunction)
        if not name.startswith("_") and name != "reset"
    ]
    trl = tokenizer.apply_chat_template(
        conversation=[prompt_messages(example)],
        tools=tools,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"][0]
    if list(trl) != list(ours):
        raise SystemExit(f"TRL would render the first context differently: {trl} vs {ours}")


def check_tool_suffix(trainer: Any, tokenizer: Any) -> None:
    """Stop unless TRL appends a tool's result to the model's turn as the chat template renders
    the conversation (what our generators' next context holds after the model's `<|end|>`)."""
    from scalerl.agents.client import render

    call = {"type": "function", "function": {"name": "calculate", "arguments": {"x": "1"}}}
    before = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    result = {"role": "tool", "name": "calculate", "content": "352"}
    turn = tokenizer.apply_chat_template(before, tokenize=False)
    ours = render(tokenizer, [*before, result], None)
    ended = len(tokenizer.encode(turn.rstrip("\n"), add_special_tokens=False))
    trl = trainer._get_tool_suffix_ids([result])
    if list(trl) != ours[ended:]:
        raise SystemExit(f"TRL appends a tool result as {trl}, the template as {ours[ended:]}")
