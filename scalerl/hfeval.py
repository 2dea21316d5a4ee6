"""Held-out pass rate of a saved checkpoint, measured with Hugging Face `generate` in torch.

Why it exists: a number checked only by the code that produced it can be wrong unnoticed, and
the held-out pass rate in `history.jsonl` is easily confused with the training batch's. This
module measures the same quantity by another path, so the run's figure (and
`bench/trl_bench.py`'s, for TRL and for us alike) can be checked against it. It shares with the
generators only what defines the question: the validation prompts as `scalerl.generator.prompts`
selects and encodes them, the reward of `scalerl.generator.rewards`, the answer as `ModelTokens`
cuts it, the EOS ids the model names.
The sampling (HF `generate`, batched, left padding; not vLLM, not `scalerl.generator.length`)
and the counting are its own.

The distribution sampled is the generators' (scalerl/generator/length.py), at
`recipe.sampling.temperature` filtered by its topP, topK and minP in the generators' order (HF's
own warpers: `sampling_settings`), stopping on every EOS id of the model:

- a thinking model (`model.thinkEnd` set, one token) thinks up to its cutoff: uniform in
  `recipe.length.interruption.window` when interruption is enabled, else `thinkingBudget`.
  `</think>` within the cutoff closes the thinking and the answer follows, at most
  `answerBudget` tokens. EOS while thinking ends the sample (complete, no answer). At the cutoff
  with interruption enabled the phrase (`spec.interruption_phrase`) is appended and the answer
  follows within `answerBudget`; with it disabled the sample is truncated there;
- a model that does not think (`thinkEnd` null) writes one phase of at most `answerBudget`;
- a sample that reaches a budget without finishing is truncated.

Tokens before the cutoff do not depend on the cutoff, so each row is sampled once: a stopping
criterion ends it at its own cutoff while thinking is open, or `answerBudget` tokens after
`</think>`. Only interrupted rows need a second `generate`, from prompt + thinking + phrase.

A sample passes when its reward is > 0 and it is not truncated (the project's one definition).
A run with spec.environment is evaluated by `scalerl.hfeval_env` (`held_out` picks it): its
held-out prompts played as multi-turn rollouts, each model turn sampled by HF `generate`.
The result counts samples, correct and truncated ones per prompt; the pass rate is correct /
(prompts x k) (mean@k), its standard error the standard deviation of the per-prompt means (ddof
1) over the square root of the number of prompts. A sample that could not be scored (the code
sandbox itself failed: `sandbox`; the reward function raised: `reward_error`) counts as not
passed and is reported (`Evaluation.unscored`, by reason).
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from scalerl.errors import DataError, InputError, ScaleRLError
from scalerl.generator.code_reward import SandboxFailure
from scalerl.generator.prompts import Example, PromptEncoder, train_and_validation
from scalerl.generator.rewards import RewardFn, load_reward
from scalerl.generator.tokens import ModelTokens
from scalerl.hfeval_result import (
    Evaluation,
    domain_rates,
    plain_generation_config,
    sampling_settings,
)
from scalerl.recipe.sampling import NO_FILTERS, SamplingFilters
from scalerl.spec import ScaleRLRun, load_run
from scalerl.status.history import REWARD_ERROR, SANDBOX, PromptScore, add_reasons
from scalerl.trainer.adapter import ADAPTER_CONFIG, is_adapter, merged_model

if TYPE_CHECKING:
    from scalerl.hfeval_env import AgentHeldOut

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BATCH_ROWS = 1024  # rows (prompt x sample) per `generate` call


# --- what is sampled ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Budgets:
    """The generators' length rules, in token ids (see the module docstring)."""

    think_end_id: int | None  # None: one answer phase
    eos_ids: tuple[int, ...]
    phrase_ids: tuple[int, ...]
    window: tuple[int, int]  # the cutoff, uniform and inclusive; (budget, budget) without it
    interrupt: bool
    answer_budget: int

    @classmethod
    def for_run(cls, run: ScaleRLRun, tokens: ModelTokens) -> Budgets:
        spec = run.spec
        length = spec.recipe.length
        interrupt = spec.thinks and length.interruption.enabled
        lo, hi = length.interruption.window if interrupt else (length.thinking_budget,) * 2
        phrase = spec.interruption_phrase if interrupt else ""
        return cls(
            think_end_id=tokens.think_end_id,
            eos_ids=tuple(sorted(tokens.eos_ids)),
            phrase_ids=tuple(tokens.tokenizer.encode(phrase, add_special_tokens=False)),
            window=(lo, hi),
            interrupt=interrupt,
            answer_budget=length.answer_budget,
        )

    def longest(self, prompt: int) -> int:
        """Tokens one sequence can reach after a prompt of `prompt` tokens."""
        if self.think_end_id is None:
            return prompt + self.answer_budget
        return prompt + self.window[1] + len(self.phrase_ids) + self.answer_budget


@dataclass(frozen=True)
class Completion:
    """One sample: its token ids (thinking, any injected phrase, the answer, the EOS that ended
    it) and whether a budget cut it."""

    ids: list[int]
    truncated: bool


@dataclass(frozen=True)
class HeldOut:
    """A run's held-out prompts encoded as its generators encode them, and how to score them."""

    examples: tuple[Example, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    tokens: ModelTokens
    rewards: Mapping[str, RewardFn]  # each example's reward (Example.reward) by name
    budgets: Budgets
    temperature: float
    pad_id: int
    filters: SamplingFilters = NO_FILTERS

    @classmethod
    def for_run(
        cls, run: ScaleRLRun, tokenizer: Any, model_path: str | Path, prompts: int | None = None
    ) -> HeldOut:
        """The validation examples of `run` (the first `prompts` of them, if given)."""
        spec = run.spec
        if spec.environment is not None:
            raise InputError(
                "spec.environment: HeldOut samples one completion per prompt; an agent run is "
                "evaluated by scalerl.hfeval_env.AgentHeldOut (`held_out` picks the right one)"
            )
        _, validation = train_and_validation(spec.data, spec.seed)
        if prompts is not None:
            if prompts < 1:
                raise InputError(f"prompts must be >= 1; got {prompts}")
            validation = validation[:prompts]
        length = spec.recipe.length
        encoder = PromptEncoder.for_data(tokenizer, spec.data, length.max_prompt_tokens)
        tokens = ModelTokens.load(model_path, tokenizer, spec.model.think_end)
        budgets = Budgets.for_run(run, tokens)
        pad = tokenizer.pad_token_id
        return cls(
            examples=tuple(validation),
            prompt_ids=tuple(tuple(encoder.encode(e)) for e in validation),
            tokens=tokens,
            rewards={
                name: load_reward(name, spec.data.code)  # a code run's own limits
                for name in dict.fromkeys([spec.data.reward, *(e.reward for e in validation)])
                if name
            },
            budgets=budgets,
            temperature=spec.recipe.sampling.temperature,
            pad_id=int(pad) if pad is not None else budgets.eos_ids[0],
            filters=SamplingFilters.of(spec.recipe.sampling),
        )

    def evaluate(
        self,
        model: Any,
        k: int,
        seed: int = 0,
        *,
        label: str = "",
        batch_rows: int = BATCH_ROWS,
    ) -> Evaluation:
        """Mean@k of `model` (an HF causal LM) on these prompts (see `sample`)."""
        started = time.monotonic()
        completions = self.sample(model, k, seed, batch_rows=batch_rows)
        return self._count(completions, k, seed, label, started)

    def sample(
        self, model: Any, k: int, seed: int = 0, *, batch_rows: int = BATCH_ROWS
    ) -> list[Completion]:
        """`k` completions of each prompt, prompt after prompt (prompt i's are `[i*k, (i+1)*k)`).

        Seeded (the cutoffs and torch's sampling); the caller's torch RNG is left as it was, and
        the model's train/eval mode too."""
        if k < 1:
            raise InputError(f"k must be >= 1; got {k}")
        self._check_room(model)
        rows = [list(p) for p in self.prompt_ids for _ in range(k)]
        rng = random.Random(seed)
        cutoffs = [rng.randint(*self.budgets.window) for _ in rows]
        completions: list[Completion] = []
        devices = [model.device.index or 0] if model.device.type == "cuda" else []
        was_training = model.training
        model.eval()
        try:
            with torch.random.fork_rng(devices=devices), torch.inference_mode():
                torch.manual_seed(seed)
                for start in range(0, len(rows), batch_rows):
                    batch = slice(start, start + batch_rows)
                    completions += self._sample(model, rows[batch], cutoffs[batch])
        finally:
            model.train(was_training)
        return completions

    # --- sampling ------------------------------------------------------------------------------

    def _check_room(self, model: Any) -> None:
        limit = getattr(model.config, "max_position_embeddings", None)
        needed = self.budgets.longest(max(len(p) for p in self.prompt_ids))
        if limit is not None and needed > limit:
            raise DataError(
                f"spec.recipe.length: prompts and budgets need {needed} tokens, over the model's "
                f"max_position_embeddings {limit}"
            )

    def _sample(self, model: Any, prompts: list[list[int]], cutoffs: list[int]) -> list[Completion]:
        b = self.budgets
        if b.think_end_id is None:
            rows = self._generate(model, prompts, b.answer_budget)
            return [self._answer([], row) for row in rows]
        stop = ThinkingStop(max(map(len, prompts)), cutoffs, b.think_end_id, b.answer_budget)
        rows = self._generate(model, prompts, b.window[1] + b.answer_budget, stop)
        done: list[Completion | None] = [
            self._read(row, c) for row, c in zip(rows, cutoffs, strict=True)
        ]
        cut = [i for i, d in enumerate(done) if d is None]
        thinking = {i: rows[i][: cutoffs[i]] + list(b.phrase_ids) for i in cut}
        answers = self._generate(model, [prompts[i] + thinking[i] for i in cut], b.answer_budget)
        for i, answer in zip(cut, answers, strict=True):
            done[i] = self._answer(thinking[i], answer)
        return [d for d in done if d is not None]

    def _read(self, row: list[int], cutoff: int) -> Completion | None:
        """A first-pass row under the length rules; None when it is interrupted at the cutoff."""
        b = self.budgets
        for at, token in enumerate(row[:cutoff]):
            if token == b.think_end_id:  # closed in time: the answer follows
                return self._answer(row[: at + 1], row[at + 1 :])
            if token in b.eos_ids:  # ended while thinking: complete, no answer
                return Completion(row[: at + 1], truncated=False)
        if b.interrupt:
            return None
        return Completion(row[:cutoff], truncated=True)  # the thinking budget, no interruption

    def _answer(self, before: list[int], answer: list[int]) -> Completion:
        """`before` + the answer up to its first EOS, within the answer budget."""
        answer = answer[: self.budgets.answer_budget]
        for at, token in enumerate(answer):
            if token in self.budgets.eos_ids:
                return Completion(before + answer[: at + 1], truncated=False)
        return Completion(before + answer, truncated=True)

    def _generate(
        self,
        model: Any,
        prompts: list[list[int]],
        max_new: int,
        stop: StoppingCriteria | None = None,
    ) -> list[list[int]]:
        """New tokens of each prompt (left padded in one batch); padding follows finished rows."""
        if not prompts:
            return []
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        sampling, processors = sampling_settings(self.temperature, self.filters)
        config = GenerationConfig(
            do_sample=True,
            num_beams=1,
            **sampling,
            max_new_tokens=max_new,
            eos_token_id=list(self.budgets.eos_ids),
            pad_token_id=self.pad_id,
        )
        with plain_generation_config(model):
            out = model.generate(
                input_ids=ids.to(model.device),
                attention_mask=mask.to(model.device),
                generation_config=config,
                logits_processor=processors,
                stopping_criteria=StoppingCriteriaList([stop] if stop else []),
            )
        new: list[list[int]] = out[:, width:].tolist()
        return new

    # --- counting ------------------------------------------------------------------------------

    def _count(
        self, completions: list[Completion], k: int, seed: int, label: str, started: float
    ) -> Evaluation:
        judged = [self._judge(self.examples[n // k], c) for n, c in enumerate(completions)]
        passed = [ok for ok, _ in judged]
        per_prompt = tuple(
            PromptScore(
                prompt_id=e.id,
                samples=k,
                correct=sum(passed[i * k : (i + 1) * k]),
                truncated=sum(c.truncated for c in completions[i * k : (i + 1) * k]),
                domain=e.domain,
                unscored=sum(bool(why) for _, why in judged[i * k : (i + 1) * k]),
                unscored_reasons=add_reasons(
                    *({why: 1} for _, why in judged[i * k : (i + 1) * k] if why)
                ),
            )
            for i, e in enumerate(self.examples)
        )
        means = [p.correct / p.samples for p in per_prompt]
        stderr = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else 0.0
        return Evaluation(
            checkpoint=label,
            k=k,
            seed=seed,
            temperature=self.temperature,
            filters=self.filters,
            per_prompt=per_prompt,
            prompts=len(per_prompt),
            samples=len(completions),
            correct=sum(passed),
            truncated=sum(c.truncated for c in completions),
            pass_rate=sum(passed) / len(completions),
            stderr=stderr,
            seconds=time.monotonic() - started,
            by_domain=domain_rates(per_prompt),
            unscored=sum(p.unscored for p in per_prompt),
            unscored_reasons=add_reasons(*(p.unscored_reasons for p in per_prompt)),
        )

    def _judge(self, example: Example, completion: Completion) -> tuple[bool, str]:
        """(passed, why it could not be scored: "" when it was). A sample whose sandbox failed
        or whose reward function raised is not passed; the data's own faults (a reference that
        is no test) still raise."""
        answer = self.tokens.answer_text(completion.ids)
        score = self._reward_of(example)  # outside the try: a missing reward is our bug
        try:
            reward = score(answer, example.answer)
        except SandboxFailure:
            return False, SANDBOX
        except ScaleRLError:
            raise
        except Exception:  # noqa: BLE001 — a user's reward: counted, as the generators count it
            return False, REWARD_ERROR
        return reward > 0 and not completion.truncated, ""

    def _reward_of(self, example: Example) -> RewardFn:
        """The example's own reward (a run of several domains), else the run's."""
        return self.rewards[example.reward] if example.reward else next(iter(self.rewards.values()))


class ThinkingStop(StoppingCriteria):
    """Ends each row at its own cutoff while its thinking is open, or `answer_budget` tokens
    after its first `</think>`; `generate` stops rows at EOS itself."""

    def __init__(self, width: int, cutoffs: Sequence[int], think_end: int, budget: int) -> None:
        self.width = width
        self.cutoffs = torch.tensor(cutoffs)
        self.closed_at = torch.full_like(self.cutoffs, -1)  # tokens up to and with </think>
        self.think_end = think_end
        self.budget = budget

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        made = input_ids.shape[1] - self.width
        last = input_ids[:, -1].cpu()
        closing = (last == self.think_end) & (self.closed_at < 0)
        self.closed_at = torch.where(closing, made, self.closed_at)
        open_ = self.closed_at < 0
        done = torch.where(open_, made >= self.cutoffs, made >= self.closed_at + self.budget)
        return done.to(input_ids.device)


# --- loading -----------------------------------------------------------------------------------


def load_spec(path: str | Path) -> ScaleRLRun:
    """A ScaleRLRun file with its paths resolved as `scalerl run` resolves them (`builtin:`
    names built and cached, hf:// ids resolved and downloaded)."""
    from scalerl.runpaths import resolve_paths

    return resolve_paths(load_run(path))


def load_model(
    checkpoint: str | Path,
    dtype: str = "float32",
    fp32_lm_head: bool = False,
    device: str = "cpu",
    base: str | Path | None = None,
) -> Any:
    """An HF model folder (a checkpoint, or a `builtin:` model), ready to sample from; a LoRA
    checkpoint (an adapter folder) is merged into `base`, the model it was trained on."""
    from transformers import AutoModelForCausalLM

    path = _model_folder(checkpoint)
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    adapter = is_adapter(path)
    if adapter and base is None:
        raise InputError(f"{path} is a LoRA adapter: its base model is needed to load it")
    try:
        if adapter and base is not None:
            model = merged_model(_model_folder(base), path, DTYPES[dtype])
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise DataError(f"{path}: cannot load the model ({err})") from None
    if fp32_lm_head and dtype != "float32":
        _head_in_fp32(model)
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers wraps `to`


def _model_folder(checkpoint: str | Path) -> Path:
    from scalerl.demo.builtins import is_builtin, resolve_builtin
    from scalerl.hub import is_hub, resolve_model

    if is_hub(checkpoint):  # resolved to a commit and downloaded into the Hugging Face cache
        resolved = resolve_model(str(checkpoint))
        print(resolved.line(), file=sys.stderr, flush=True)  # stdout holds the results
        path = Path(resolved.path)
    else:
        path = resolve_builtin(str(checkpoint)) if is_builtin(checkpoint) else Path(checkpoint)
    if not (path / "config.json").is_file() and not is_adapter(path):
        raise DataError(
            f"{path}: not a Hugging Face model folder (no config.json) nor a LoRA adapter "
            f"(no {ADAPTER_CONFIG})"
        )
    return path


def _head_in_fp32(model: Any) -> None:
    """Run the output projection in float32 (spec.model.fp32LMHead), as the engines do."""
    head = model.get_output_embeddings()

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        bias = None if head.bias is None else head.bias.float()
        return torch.nn.functional.linear(hidden.float(), head.weight.float(), bias)

    head.forward = forward


def _tokenizer(checkpoint: Path, base: str) -> Any:
    """The checkpoint's tokenizer (checkpoints carry one), else the base model's."""
    from transformers import AutoTokenizer

    for folder in (checkpoint, Path(base)):
        if (folder / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(folder))
    raise DataError(f"{checkpoint}: no tokenizer in it or in spec.model.path {base}")


def evaluate_checkpoint(
    checkpoint: str | Path,
    run: ScaleRLRun,
    *,
    k: int | None = None,
    prompts: int | None = None,
    seed: int = 0,
    dtype: str | None = None,
    device: str = "cpu",
    batch_rows: int = BATCH_ROWS,
) -> Evaluation:
    """Mean@k of a saved model folder on `run`'s held-out prompts (paths already resolved: see
    `load_spec`). `k` defaults to `evaluation.generationsPerPrompt`, `prompts` to all of
    `data.validation.prompts`, `dtype` to float32 (the distribution without rounding)."""
    for name, value in (("k", k), ("prompts", prompts)):
        if value is not None and value < 1:  # said before the minutes a model can take to load
            raise InputError(f"{name} must be >= 1; got {value}")
    spec = run.spec
    folder = _model_folder(checkpoint)
    tokenizer = _tokenizer(folder, spec.model.path)
    base = spec.model.path
    model = load_model(folder, dtype or "float32", spec.model.fp32_lm_head, device, base)
    # An adapter has no config of its own: the base's says which tokens end a turn.
    held = held_out(run, tokenizer, base if is_adapter(folder) else folder, prompts)
    k = spec.evaluation.generations_per_prompt if k is None else k
    return held.evaluate(model, k, seed, label=str(checkpoint), batch_rows=batch_rows)


def held_out(
    run: ScaleRLRun, tokenizer: Any, model_path: str | Path, prompts: int | None = None
) -> HeldOut | AgentHeldOut:
    """The run's held-out evaluation: `HeldOut` (one completion per prompt, scored by
    data.reward), or for a run with spec.environment its multi-turn rollouts
    (`scalerl.hfeval_env.AgentHeldOut`); both `evaluate(model, k, seed, label=...)`."""
    if run.spec.environment is None:
        return HeldOut.for_run(run, tokenizer, model_path, prompts)
    from scalerl.hfeval_env import AgentHeldOut

    return AgentHeldOut.for_run(run, tokenizer, model_path, prompts)


def iter_checkpoints(run_dir: str | Path) -> Iterator[tuple[int, Path]]:
    """(step, folder) of each complete checkpoint under `run_dir/checkpoints`, by step."""
    root = Path(run_dir) / "checkpoints"
    found = []
    for folder in root.glob("step-*") if root.is_dir() else []:
        step = folder.name.removeprefix("step-")
        if step.isdigit() and ((folder / "config.json").is_file() or is_adapter(folder)):
            found.append((int(step), folder))
    yield from sorted(found)
