"""The ScaleRLRun resource as typed Python: the one source of defaults (= the ScaleRL recipe) and
validation.

A spec is parsed once, at the edge (`load_run`, `parse_run`), into frozen models; every process then
reads only its own slice. Field names are the YAML's camelCase; Python attributes are snake_case.
Defaults and numbers come from "The Art of Scaling RL Compute for LLMs" (arXiv 2510.13786) unless a
comment says otherwise. This module must stay light: no torch, no vLLM, no kopf.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from scalerl.errors import InputError, SpecError

API_VERSION = "scalerl.dev/v1alpha1"
KIND = "ScaleRLRun"
HUB_PREFIX = "hf://"  # a Hub id (scalerl.hub resolves it; the operator only recognises it)
THINK_END = "</think>"
# The paper's interruption sentence; the model's own end-of-thinking marker follows it.
INTERRUPTION_TEXT = "Okay, time is up. Let me stop thinking and formulate a final answer now."
INTERRUPTION_PHRASE = f"{INTERRUPTION_TEXT} {THINK_END}"
_REWARD = re.compile(r"^(math|exact|code|[A-Za-z_][\w.]*:[A-Za-z_]\w*)$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A model validator's message that starts with this names a field below the validated model, so
# the user reads "spec.recipe.length.interruption.enabled: ..." rather than "spec: ...".
_AT = "@"
T = TypeVar("T")

# Numbers are strict: YAML's `true` or "1e-3" where a number belongs is a mistake, not a value,
# and inf/NaN can only be typos. Upper bounds (`le=`) catch values that can only be typos too.
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Int = Annotated[int, Field(strict=True)]
Bool = Annotated[bool, Field(strict=True)]
MAX_TOKENS = 1 << 20  # lengths and budgets, in tokens
MAX_REPLICAS = 10_000
MAX_GPUS = 64  # per replica (one node)
MAX_STEPS = 100_000_000
# What a GPU pod requests besides its GPUs, per GPU, unless its resources say otherwise: without
# requests it would be BestEffort, the first evicted under memory pressure. /dev/shm (memory)
# may hold up to SHM_PER_GPU_GIB per GPU (SHM_CPU_POD_GIB in a CPU pod).
CPU_PER_GPU = 4
MEMORY_PER_GPU_GIB = 32
SHM_PER_GPU_GIB = 8
SHM_CPU_POD_GIB = 1


def _at(field: str, message: str) -> ValueError:
    return ValueError(f"{_AT}{field}: {message}")


class _Model(BaseModel):
    """Frozen, camelCase in YAML, unknown fields rejected."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )


# --- model and data -----------------------------------------------------------------------------


# The ranks vLLM's engine can serve (its max_lora_rank takes these); an adapter of a rank in
# between is served with the next one up.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class LoraSpec(_Model):
    """Train a LoRA adapter instead of the whole model (PEFT on the trainers, vLLM's LoRA on the
    generators): the base stays frozen, only the adapter is trained, checkpointed and sent."""

    rank: Int = Field(16, ge=1, le=LORA_RANKS[-1], description="The adapter's rank r.")
    alpha: Int = Field(
        32, ge=1, le=1 << 20, description="LoRA's alpha: the update is scaled by alpha / rank."
    )
    dropout: Float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapter's input in the trainer's training pass (the "
        "generators sample without it).",
    )
    target_modules: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        min_length=1,
        description="Names of the linear layers to adapt (e.g. q_proj); null: every linear "
        "layer of the model's decoder blocks (its attention and MLP projections), found from "
        "the model. The LM head is never adapted.",
    )


class ModelSpec(_Model):
    """The model trained: its weights, dtype, end-of-thinking marker and an optional adapter."""

    path: str = Field(
        min_length=1,
        description="The base model: a local directory of a Hugging Face format model, or a "
        "Hub id hf://org/name[@revision] (the revision is resolved to a commit once, at the "
        "run's start, and downloaded into the Hugging Face cache).",
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Dtype of the model body on trainers and generators."
    )
    fp32_lm_head: Bool = Field(
        True,
        alias="fp32LMHead",
        description="Compute the LM head (logits) in float32 on both sides; paper: A 0.52 -> 0.61.",
    )
    think_end: str | None = Field(
        THINK_END,
        min_length=1,
        description="The model's end-of-thinking marker, one token of its tokenizer; null for a "
        "model that does not think (the whole completion is the answer).",
    )
    lora: LoraSpec | None = Field(
        None, description="Train a LoRA adapter on the frozen model; absent: train every weight."
    )


# Domains of one run: each gets its own curve, fit and status entry, so their number is bounded
# (status.evaluations and status.prediction must stay small). A domain is a label value and a
# key in status: a short lowercase name.
MAX_DOMAINS = 8
_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9_.-]{0,30}[a-z0-9])?$")


def domain_problem(name: str) -> str | None:
    """Why `name` cannot be a domain, or None."""
    if _DOMAIN.match(name):
        return None
    return (
        f"{name!r} is not a domain name (1-32 of a-z, 0-9, '_', '.', '-', starting and ending "
        "with a letter or digit)"
    )


def reward_problem(name: str) -> str | None:
    """Why `name` cannot be a reward, or None."""
    if _REWARD.match(name):
        return None
    return f"{name!r} is not one of math, exact, code, or module:function"


def default_domain(reward: str) -> str:
    """A row's domain when it names none: its reward's name (a module:function reward: its
    function's name, lowercased, so it stays a domain name)."""
    name = reward.rpartition(":")[2].rpartition(".")[2].lower()
    return name if _DOMAIN.match(name) else "custom"


class DataSource(_Model):
    """One data file of a run whose data is a list of files, with the reward its rows are scored
    by (and the domain their pass rate and curve are reported under)."""

    path: str = Field(
        min_length=1,
        description="A JSONL or Parquet file (or a builtin: name), or a Hub dataset id "
        "hf://datasets/org/name[@revision][/path] (hf://org/name also reads as a dataset).",
    )
    split: str | None = Field(
        None,
        min_length=1,
        description="For a Hub dataset: the split whose files are read (train-*.parquet, "
        "data/train.jsonl, ...); null: train for data.train, validation (else test) for "
        "data.validation.path.",
    )
    data_files: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        min_length=1,
        description="For a Hub dataset: globs of the repo's files to read (JSONL or Parquet), "
        "instead of a split's.",
    )
    reward: str | None = Field(
        None,
        description="The reward of this file's rows (a row's own `reward` field wins); "
        "null: spec.data.reward.",
    )
    domain: str | None = Field(
        None,
        description="The domain this file's rows are reported under (a row's own `domain` "
        "field wins); null: the reward's name.",
    )

    @field_validator("reward")
    @classmethod
    def _reward_name(cls, value: str | None) -> str | None:
        problem = None if value is None else reward_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("domain")
    @classmethod
    def _domain_name(cls, value: str | None) -> str | None:
        problem = None if value is None else domain_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _hub_selection(self) -> DataSource:
        if (self.split or self.data_files) and not self.path.startswith(HUB_PREFIX):
            raise ValueError("split and dataFiles select the files of a Hub dataset (hf://)")
        return self


# data.train and data.validation.path: one file, or a list of files each with its reward. Told
# apart by the value's type, so a bad one gets one message about the form it has (the tags are
# dropped from the field's path in messages).
_FILE, _SOURCES = "<file>", "<sources>"


def _file_or_sources(value: Any) -> str | None:
    if isinstance(value, str):
        return _FILE
    return _SOURCES if isinstance(value, list | tuple) else None


Sources = Annotated[
    Annotated[str, Tag(_FILE), Field(min_length=1)]
    | Annotated[list[DataSource], Tag(_SOURCES), Field(min_length=1, max_length=64)],
    Discriminator(
        _file_or_sources,
        custom_error_type="file_or_sources",
        custom_error_message="must be a file (JSONL or Parquet) or a list of sources, each "
        "{path, reward, domain}",
    ),
]


class ValidationSpec(_Model):
    """The held-out prompts every evaluation scores: the points the law is fitted to."""

    path: Sources | None = Field(
        None,
        description="Held-out prompts (JSONL or Parquet, or a Hub dataset hf://datasets/...: "
        "its validation, else test, split), or a list of sources ({path, reward, domain, split, "
        "dataFiles}: `prompts` is shared evenly among their files); when unset, held out from "
        "train.",
    )
    prompts: Int = Field(
        1000, ge=1, le=10_000_000, description="Number of held-out prompts; paper: 1,000."
    )


class CodeSpec(_Model):
    """How `reward: code` runs a completion's program against its tests (scalerl.sandbox)."""

    test_timeout_seconds: Float = Field(
        6.0, gt=0, le=3600, description="Wall and CPU time of one test case."
    )
    problem_timeout_seconds: Float = Field(
        60.0,
        gt=0,
        le=36_000,
        description="Wall time of all of one completion's tests together; tests left when it "
        "runs out fail as timeouts.",
    )
    memory_mib: Int = Field(
        1024,
        ge=64,
        le=1 << 20,
        alias="memoryMiB",
        description="Address-space limit of a test's process, MiB.",
    )
    processes: Int = Field(
        32, ge=1, le=4096, description="Processes (and threads) a test may run at once."
    )
    output_mib: Int = Field(
        16,
        ge=1,
        le=4096,
        alias="outputMiB",
        description="Output a test may print (or write) before it is killed, MiB.",
    )
    workers: Int = Field(
        0,
        ge=0,
        le=4096,
        description="Tests run at once by a generator; 0: one per CPU the process may use.",
    )


class DataSpec(_Model):
    """The prompts: training and held-out files or Hub datasets, their fields and reward."""

    train: Sources | None = Field(
        None,
        description="Training prompts: JSONL (one object per line) or Parquet (.parquet), or a "
        "Hub dataset hf://datasets/org/name[@revision][/path] (its train split); or a list of "
        "sources, each {path, reward, domain, split, dataFiles}, to mix domains (math and code) "
        "in one run.",
    )
    prompt_field: str = Field("prompt", min_length=1, description="Column holding the prompt.")
    answer_field: str = Field(
        "answer", min_length=1, description="Column holding the reference answer."
    )
    system_prompt: str | None = Field(
        None, description="System message; used only with chatTemplate: true."
    )
    chat_template: Bool = Field(
        False,
        description="Format prompts with the tokenizer's chat template (instruct models); "
        "false sends the raw prompt text (base models).",
    )
    validation: ValidationSpec = ValidationSpec()
    reward: str = Field(
        "math",
        description="math (math-verify) | exact | code (the answer's program run against the "
        "row's tests in a sandbox) | module:function returning +1/-1.",
    )
    code: CodeSpec = Field(
        CodeSpec(), description="Limits of the sandbox that runs programs for reward: code."
    )
    log_consumed: Bool = Field(
        False,
        description="Write which prompts each training step took (id, epoch, generator) to "
        "consumed.jsonl beside history.jsonl: a line per step, so off for large runs.",
    )

    @field_validator("reward")
    @classmethod
    def _reward_name(cls, value: str) -> str:
        problem = reward_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _few_domains(self) -> DataSpec:
        for field, sources in (("train", self.train_sources), ("validation.path", self.held_out)):
            domains = {s.domain or default_domain(s.reward or self.reward) for s in sources()}
            if len(domains) > MAX_DOMAINS:
                raise _at(field, f"{len(domains)} domains, more than {MAX_DOMAINS}")
        return self

    def train_sources(self) -> list[DataSource]:
        """data.train as sources, each with its reward filled in (a file named alone, or a
        source naming none, takes spec.data.reward); a domain stays None where the source names
        none, since a row's own reward then decides it (`default_domain`)."""
        return self._filled(self.train)

    def held_out(self) -> list[DataSource]:
        """data.validation.path as sources (rewards filled in); [] when held out from train."""
        path = self.validation.path
        return [] if path is None else self._filled(path)

    def rewards(self) -> list[str]:
        """The rewards the sources name (spec.data.reward where they name none), in order;
        rows may name others (checked when they are read)."""
        names = [s.reward or self.reward for s in self.train_sources() + self.held_out()]
        return list(dict.fromkeys(names))

    def _filled(self, value: str | list[DataSource] | None) -> list[DataSource]:
        if value is None:
            return []
        sources = [DataSource(path=value)] if isinstance(value, str) else value
        return [s.model_copy(update={"reward": s.reward or self.reward}) for s in sources]


# --- recipe --------------------------------------------------------------------------------------

# The default ratio cap and clips; scalerl.recipe and the trainer take theirs from here.
EPSILON_MAX = 4.0  # CISPO's cap on the token ratio
EPSILON_LOW = 0.2  # DAPO's lower clip
EPSILON_HIGH = 0.28  # DAPO's upper clip


class CispoLoss(_Model):
    """Truncated importance sampling with a plain policy gradient (ScaleRL's loss)."""

    type: Literal["cispo"] = Field("cispo", description="The loss: cispo is ScaleRL's.")
    epsilon_max: Float = Field(
        EPSILON_MAX, gt=0, le=1000, description="Upper cap on the token ratio; 4, 5, 8 alike."
    )


class DapoLoss(_Model):
    type: Literal["dapo"] = Field(description="The loss (required for any but cispo).")
    epsilon_low: Float = Field(EPSILON_LOW, ge=0, lt=1, description="Lower clip; DAPO paper 0.2.")
    epsilon_high: Float = Field(
        EPSILON_HIGH, gt=0, le=10, description="Upper clip; DAPO paper 0.28."
    )


class GrpoLoss(_Model):
    type: Literal["grpo"] = Field(description="The loss (required for any but cispo).")
    epsilon_low: Float = Field(0.2, ge=0, lt=1, description="Symmetric clip; GRPO 0.2.")
    epsilon_high: Float = Field(0.2, gt=0, le=10, description="Symmetric clip; GRPO 0.2.")


class GspoLoss(_Model):
    """Sequence-level ratio; clips on the 1e-3 scale worked in the paper."""

    type: Literal["gspo"] = Field(description="The loss (required for any but cispo).")
    epsilon_low: Float = Field(3e-3, ge=0, lt=1, description="Paper: 3e-3.")
    epsilon_high: Float = Field(4e-3, gt=0, le=10, description="Paper: 4e-3 to 5e-3.")


LossSpec = Annotated[CispoLoss | DapoLoss | GrpoLoss | GspoLoss, Field(discriminator="type")]
LOSS_TYPES = ("cispo", "dapo", "gspo", "grpo")


class NoPositiveResamplingSpec(_Model):
    """The curriculum: prompts the policy already solves leave later epochs."""

    enabled: Bool = Field(True, description="On: the curriculum is applied (paper: on).")
    pass_rate_threshold: Float = Field(
        0.9, gt=0, le=1, description="Prompts at or above this pass rate leave later epochs."
    )


class InterruptionSpec(_Model):
    """Forced length interruption (paper): at a thinking length drawn uniformly from `window`,
    the phrase is appended (not trained on) and the model writes its answer."""

    enabled: Bool = Field(True, description="On (paper); must be off when model.thinkEnd is null.")
    window: tuple[Int, Int] = Field(
        (10240, 12288), description="Thinking tokens where the phrase is injected (uniform)."
    )
    phrase: str | None = Field(
        None,
        min_length=1,
        description="Injected text; default: the paper's sentence followed by model.thinkEnd.",
    )


class LengthSpec(_Model):
    """A completion's length budgets, in tokens, and the forced interruption."""

    max_prompt_tokens: Int = Field(2048, ge=1, le=MAX_TOKENS, description="Longest prompt.")
    thinking_budget: Int = Field(
        12288,
        ge=1,
        le=MAX_TOKENS,
        description="Thinking tokens before interruption (unused when model.thinkEnd is null).",
    )
    answer_budget: Int = Field(
        2048,
        ge=1,
        le=MAX_TOKENS,
        description="Tokens after thinkEnd (or the phrase); the whole completion without thinking.",
    )
    interruption: InterruptionSpec = InterruptionSpec()

    @model_validator(mode="after")
    def _window_inside_budget(self) -> LengthSpec:
        lo, hi = self.interruption.window
        if self.interruption.enabled and not 0 < lo <= hi <= self.thinking_budget:
            raise _at(
                "interruption.window",
                f"[{lo}, {hi}] must satisfy 0 < start <= end <= thinkingBudget "
                f"({self.thinking_budget})",
            )
        return self

    @property
    def max_completion_tokens(self) -> int:
        return self.thinking_budget + self.answer_budget


class BatchSpec(_Model):
    """One training step's batch: prompts times generations per prompt."""

    prompts: Int = Field(48, ge=1, le=100_000, description="Prompts per step; paper: 48.")
    generations_per_prompt: Int = Field(
        16, ge=2, le=1024, description="Samples per prompt; paper: 16."
    )


class OptimizerSpec(_Model):
    """AdamW and its learning-rate schedule."""

    lr: Float = Field(5e-7, gt=0, le=1, description="AdamW lr, constant after warm-up; paper 5e-7.")
    weight_decay: Float = Field(0.01, ge=0, le=10, description="AdamW weight decay.")
    eps: Float = Field(1e-15, gt=0, le=1, description="AdamW epsilon; paper 1e-15.")
    warmup_steps: Int = Field(
        100, ge=0, le=MAX_STEPS, description="Linear warm-up steps; paper 100."
    )
    max_grad_norm: Float | None = Field(
        1.0,
        gt=0,
        le=1e6,
        description="Clip the total gradient norm to this (null: no clipping). Not stated in the "
        "paper; 1.0 as TRL, chosen by bench/stability_bench.py: at lr 3e-4 it cut the largest "
        "importance ratio from 2.2 to 1.3 and the gradient-norm spikes from 23 to 8, with a "
        "higher B.",
    )


class SamplingSpec(_Model):
    """How the generators sample completions."""

    temperature: Float = Field(1.0, gt=0, le=10, description="Not stated in the paper; 1.0.")


class RecipeSpec(_Model):
    """The ScaleRL recipe; every field left out takes the paper's value."""

    algorithm: Literal["pipelinerl", "ppo-off-policy"] = Field(
        "pipelinerl",
        description="pipelinerl: generators sample while the trainer steps and take new weights "
        "in flight (PipelineRL-k, the paper's); ppo-off-policy: k steps per generated batch.",
    )
    max_off_policy_steps: Int = Field(
        8,
        ge=1,
        le=1000,
        description="k: PipelineRL-k staleness bound, or PPO-off-policy-k steps/batch.",
    )
    loss: LossSpec = Field(
        CispoLoss(), description="The loss and its clipping, by type (cispo: ScaleRL's)."
    )
    aggregation: Literal["prompt", "sample", "token"] = Field(
        "prompt", description="Loss averaged per prompt (paper), per sample or per token."
    )
    advantage_normalization: Literal["batch", "prompt", "none"] = Field(
        "batch",
        description="Advantages divided by the standard deviation of the batch (paper) or of "
        "the prompt's group, or not at all.",
    )
    zero_variance_filtering: Bool = Field(
        True, description="Drop prompt groups whose rewards are all equal (no learning signal)."
    )
    no_positive_resampling: NoPositiveResamplingSpec = NoPositiveResamplingSpec()
    length: LengthSpec = LengthSpec()
    batch: BatchSpec = BatchSpec()
    optimizer: OptimizerSpec = OptimizerSpec()
    sampling: SamplingSpec = SamplingSpec()

    @field_validator("max_off_policy_steps", mode="before")
    @classmethod
    def _some_lag(cls, value: Any, info: ValidationInfo) -> Any:
        # Before `ge=1`, so that 0 is told what it would do, not only that it is too small.
        if type(value) is not int or value != 0:
            return value
        if info.data.get("algorithm") == "ppo-off-policy":
            raise ValueError(
                "must be >= 1: with ppo-off-policy it is the optimizer steps taken on each "
                "generated batch, and 0 steps would train nothing"
            )
        raise ValueError(
            "must be >= 1: with pipelinerl, 0 would keep only groups sampled wholly by the "
            "newest weights, but the generators sample while the trainer steps, so every group "
            "in flight at a weight update would be dropped as stale; 1 is the most on-policy "
            "pipelinerl runs (paper: 8)"
        )

    @property
    def steps_per_round(self) -> int:
        """Optimizer steps between two weight broadcasts: k with ppo-off-policy, else 1."""
        return self.max_off_policy_steps if self.algorithm == "ppo-off-policy" else 1


def _rounds(recipe: RecipeSpec) -> str:
    k = recipe.steps_per_round
    return f", at the end of each round of {k} ppo-off-policy steps" if k > 1 else ""


# --- schedule, budget, placement -----------------------------------------------------------------


class EvaluationSpec(_Model):
    """Held-out evaluations: the pass rates the scaling law is fitted to."""

    every_steps: Int = Field(
        100,
        ge=1,
        le=MAX_STEPS,
        description="Evaluate held-out prompts every N steps (ppo-off-policy-k: once after a "
        "round of k steps that a multiple of N falls in, on the weights it ends with).",
    )
    generations_per_prompt: Int = Field(16, ge=1, le=1024, description="k of mean@k; paper 16.")
    log_completions: Int = Field(
        0,
        ge=0,
        le=1024,
        description="Completions of each evaluation written to the run's "
        "evaluations/step-N.completions.jsonl for a person to read (prompt, completion, "
        "answer, reward); 0: none.",
    )


def evaluation_steps(max_steps: int, every_steps: int, round_steps: int = 1) -> list[int]:
    """The steps a run to max_steps evaluates at: step 0; the end of each round of round_steps
    steps (PPO-off-policy-k's k, the last round cut at max_steps; 1 otherwise) that a multiple
    of every_steps falls in, on the weights the round ends with; and the last step."""
    steps = [0]
    for start in range(0, max_steps, round_steps):
        end = min(start + round_steps, max_steps)
        if end // every_steps > start // every_steps:
            steps.append(end)
    if steps[-1] != max_steps:
        steps.append(max_steps)
    return steps


class FitSpec(_Model):
    """The sigmoidal law's fit: how often, and over which evaluations."""

    every_evaluations: Int = Field(
        5, ge=1, le=10_000, description="Refit after this many new evaluations."
    )
    min_compute: Float | None = Field(
        None,
        ge=0,
        le=1e9,
        description="Exclude points below this compute (the run's unit: GPU-hours, or "
        "process-hours for a CPU run); null: 3 % of the largest compute so far, as the paper's "
        "~1.5k of 50k GPU-hours.",
    )


# Points past the compute floor a prediction needs before it is more than "too early": the
# paper fits dozens; with fewer, an extrapolation of three shape parameters rests on too little.
PREDICTION_MIN_POINTS = 8
# The fewest points past the floor the fitter fits at all (scalerl.fit.fitter.MIN_POINTS).
FIT_MIN_POINTS = 4
# A prediction's confidence (scalerl.fit.outlook says when each applies); one word each: a
# kubectl column splits on spaces.
TOO_EARLY, UNCHECKED, MISFIT, OK = "TooEarly", "Unchecked", "Misfit", "OK"


class StopWhenSpec(_Model):
    """Stop a hopeless run: the point of predicting a run is not paying for the rest of it."""

    predicted_a_below: Float = Field(
        alias="predictedABelow",
        gt=0,
        le=1,
        description="Stop when the whole A interval of a checked fit (confidence OK: its "
        "half-run backtest ran and held) lies below this pass rate.",
    )
    min_points: Int = Field(
        PREDICTION_MIN_POINTS,
        ge=PREDICTION_MIN_POINTS,
        le=10_000,
        description="Only after the fit used at least this many trained evaluations past "
        f"fit.minCompute (at least {PREDICTION_MIN_POINTS}: a fit of fewer is TooEarly, and "
        "its A interval can be far too narrow to stop a run on).",
    )


class BudgetSpec(_Model):
    """Where the run ends (the first budget it reaches) and what it aims at."""

    max_steps: Int = Field(10000, ge=1, le=MAX_STEPS, description="Optimizer steps at most.")
    max_compute_hours: Float = Field(
        16000, gt=0, le=1e9, description="GPU-hours; process-hours for a CPU run."
    )
    stop_when: StopWhenSpec | None = Field(
        None,
        description="Prediction-driven early stop, on a cluster and by `scalerl run`: the run "
        "ends (Stopped, reason PredictedBelowTarget) without a restart.",
    )
    target_pass_rate: Float | None = Field(
        None,
        gt=0,
        le=1,
        description="A held-out pass rate to reach: the prediction says at what compute "
        "(computeToTarget) and how soon (etaSeconds.target) the fitted curve reaches it.",
    )

    def end(self, step: int, compute: float) -> tuple[float, str]:
        """Where a run that is at `step` having spent `compute` will stop: the compute of the
        first budget it hits (maxSteps at its compute per step so far, or maxComputeHours), and
        that budget's field name."""
        if step <= 0 or compute <= 0:
            return self.max_compute_hours, "maxComputeHours"
        at_max_steps = compute / step * self.max_steps
        if at_max_steps < self.max_compute_hours:
            return at_max_steps, "maxSteps"
        return self.max_compute_hours, "maxComputeHours"


class FailurePolicySpec(_Model):
    """When a gang restarts from its checkpoint, and when the run fails."""

    max_restarts: Int = Field(
        3, ge=0, le=1000, description="Gang restarts from the last checkpoint before Failed."
    )
    peer_timeout_seconds: Int = Field(
        300,
        ge=1,
        le=24 * 3600,
        description="How long a process waits for a silent peer (no rollouts, no command) "
        "before it fails and the gang restarts; the first meeting of a gang's processes waits "
        "up to startupTimeoutSeconds instead.",
    )
    startup_timeout_seconds: Int = Field(
        1800,
        ge=1,
        le=7 * 24 * 3600,
        description="On a cluster: how long a run's gangs may take until every pod runs "
        "(scheduling, autoscaling, image pulls), counted from the first gang since it last ran "
        "(a queued run: since Kueue admitted it); past it the run fails. Gangs that fail while "
        "starting use up no maxRestarts.",
    )
    no_signal_steps: Int = Field(
        50,
        ge=1,
        le=1_000_000,
        description="Fail after this many consecutive steps whose every group was filtered out "
        "(all right or all wrong): such a run learns nothing.",
    )


# --- where pods run on a cluster (core/v1 scheduling fields, typed so the CRD validates them) -----

# A DNS-1123 subdomain: the names of PriorityClasses, RuntimeClasses and schedulers.
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_KEY = (  # an optional DNS-subdomain prefix and "/", then a name of up to 63 characters
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
LabelKey = Annotated[str, Field(min_length=1, max_length=316, pattern=_LABEL_KEY)]
ClassName = Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)]
# The weight of a preferred term: 1-100.
Weight = Annotated[int, Field(strict=True, ge=1, le=100)]


class Toleration(_Model):
    """Lets the pods onto nodes with a matching taint (a GPU pool's `nvidia.com/gpu:NoSchedule`)."""

    key: LabelKey | None = Field(None, description="Taint key; absent: every taint (Exists).")
    operator: Literal["Exists", "Equal"] = Field(
        "Equal", description="Equal: the taint's value must match; Exists: any value."
    )
    value: str | None = Field(None, max_length=63, description="Taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; absent: every effect."
    )
    toleration_seconds: Int | None = Field(
        None, ge=0, le=10**9, description="NoExecute only: how long the pod stays once tainted."
    )

    @model_validator(mode="after")
    def _as_kubernetes_checks(self) -> Toleration:
        # The API server's own rules for a pod's tolerations: a Job whose pods break them
        # would only fail to create its pods.
        if self.key is None and self.operator != "Exists":
            raise _at("operator", "must be Exists when key is absent (a toleration of every taint)")
        if self.operator == "Exists" and self.value:
            raise _at("value", "must be absent with operator Exists")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise _at("tolerationSeconds", "applies only to effect NoExecute")
        return self


class NodeSelectorRequirement(_Model):
    """A node label (or field) and the values it must or must not hold."""

    key: LabelKey = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="How the label relates to the values."
    )
    values: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="The values: some for In and NotIn, none for Exists and DoesNotExist, "
        "one integer for Gt and Lt.",
    )

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> NodeSelectorRequirement:
        need = {"In": "some", "NotIn": "some", "Exists": "none", "DoesNotExist": "none"}
        wanted = need.get(self.operator, "one")  # Gt, Lt: one integer
        if (wanted == "some" and not self.values) or (wanted == "none" and self.values):
            raise _at(
                "values",
                f"{'required' if wanted == 'some' else 'must be empty'} "
                f"with operator {self.operator}",
            )
        if wanted == "one" and (len(self.values) != 1 or not self.values[0].lstrip("-").isdigit()):
            raise _at("values", f"must be one integer with operator {self.operator}")
        return self


class LabelSelectorRequirement(_Model):
    """A label and the values it must or must not hold."""

    key: LabelKey = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the label relates to the values."
    )
    values: list[str] = Field(
        default_factory=list,
        max_length=1000,
        description="The values: some for In and NotIn, none for Exists and DoesNotExist.",
    )

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelSelectorRequirement:
        if (self.operator in ("In", "NotIn")) != bool(self.values):
            raise _at(
                "values",
                f"{'required' if self.operator in ('In', 'NotIn') else 'must be empty'} "
                f"with operator {self.operator}",
            )
        return self


class LabelSelector(_Model):
    """A label query (Kubernetes' LabelSelector): matchLabels and matchExpressions, ANDed."""

    match_labels: dict[LabelKey, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, description="Labels the resource must have, key: value."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Label requirements, ANDed."
    )


class NodeSelectorTerm(_Model):
    """Node requirements, ANDed (Kubernetes' NodeSelectorTerm)."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list)


class NodeSelector(_Model):
    """Nodes that match any one of the terms (Kubernetes' NodeSelector)."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=100)


class PreferredSchedulingTerm(_Model):
    """A node preference and its weight (Kubernetes' PreferredSchedulingTerm)."""

    weight: Weight = Field(description="Added to a matching node's score (1-100).")
    preference: NodeSelectorTerm


class NodeAffinity(_Model):
    """Which nodes the pods may or prefer to run on (Kubernetes' NodeAffinity)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list
    )


class PodAffinityTerm(_Model):
    """The pods to run near (or away from), within a topology domain (PodAffinityTerm)."""

    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces of the pods selected; empty without namespaceSelector: the "
        "run's own.",
    )
    topology_key: LabelKey = Field(
        description="Node label whose value is the domain (kubernetes.io/hostname: one node)."
    )


class WeightedPodAffinityTerm(_Model):
    """A pod affinity term and its weight (Kubernetes' WeightedPodAffinityTerm)."""

    weight: Weight = Field(description="Added to a matching node's score (1-100).")
    pod_affinity_term: PodAffinityTerm


class PodAffinity(_Model):
    """Run near (podAffinity) or away from (podAntiAffinity) other pods (PodAffinity)."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list
    )


class Affinity(_Model):
    """The pods' affinity, as core/v1 Affinity has it (pod terms: labelSelector, namespaces,
    namespaceSelector, topologyKey)."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class SchedulingSpec(_Model):
    """Where pods may run on a cluster: the core/v1 PodSpec fields of the same names. Every field
    is absent by default; in `trainers.scheduling` or `generators.scheduling` a field that is
    present replaces the run-wide `scheduling`'s (whole: two lists of tolerations are not
    merged)."""

    node_selector: dict[LabelKey, Annotated[str, Field(max_length=63)]] | None = Field(
        None, description="Node labels the pods need (e.g. a GPU type)."
    )
    tolerations: list[Toleration] | None = Field(
        None, max_length=100, description="Taints the pods tolerate (tainted GPU pools)."
    )
    affinity: Affinity | None = None
    priority_class_name: ClassName | None = Field(
        None, description="A PriorityClass (e.g. one that protects a gang from preemption)."
    )
    runtime_class_name: ClassName | None = Field(
        None, description="A RuntimeClass (k3s and RKE2 expose GPUs through 'nvidia')."
    )
    scheduler_name: ClassName | None = Field(
        None, description="A scheduler other than the default."
    )

    def over(self, default: SchedulingSpec) -> SchedulingSpec:
        """These fields where present, `default`'s elsewhere (the pod fields only: a run's
        queue is the gang's, not a pod's)."""
        return SchedulingSpec.model_construct(
            **{
                k: getattr(self, k) if getattr(self, k) is not None else getattr(default, k)
                for k in SchedulingSpec.model_fields
            }
        )

    def pod_fields(self) -> dict[str, Any]:
        """The PodSpec fields these set (camelCase, absent ones left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# The label by which Kueue knows a workload's LocalQueue; on a run, it names the run's queue.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
QueueName = Annotated[str, Field(min_length=1, max_length=63, pattern=_DNS_LABEL.pattern)]


class RunSchedulingSpec(SchedulingSpec):
    """The whole run's scheduling: the pod fields, and the queue its gang is admitted through."""

    queue_name: QueueName | None = Field(
        None,
        description="A Kueue LocalQueue in the run's namespace: the gang (every trainer and "
        "generator pod) is one Kueue workload, admitted all at once or not at all. Needs Kueue "
        f"with its JobSet integration, and JobSet. The run's label {QUEUE_LABEL} does the same.",
    )


class ReplicaSpec(_Model):
    replicas: Int = Field(1, ge=1, le=MAX_REPLICAS)
    gpus: Int = Field(8, ge=0, le=MAX_GPUS, description="GPUs per replica (0 = CPU).")
    image: str | None = Field(None, min_length=1, description="Container image (cluster only).")
    resources: dict[str, Any] = Field(
        default_factory=dict,
        description="Container resources (requests/limits) in the cluster. A GPU pod requests "
        f"{CPU_PER_GPU} CPUs and {MEMORY_PER_GPU_GIB}Gi of memory per GPU unless these say.",
    )
    scheduling: SchedulingSpec = Field(
        SchedulingSpec(), description="This role's scheduling; its fields replace the run's."
    )


class GeneratorsSpec(ReplicaSpec):
    """The generator processes (pods): vLLM engines that sample the rollouts."""

    replicas: Int = Field(8, ge=1, le=MAX_REPLICAS, description="Generator processes (pods).")
    tensor_parallel: Int = Field(
        1, ge=1, le=MAX_GPUS, description="vLLM tensor-parallel size of each generator's engine."
    )


class TrainersSpec(ReplicaSpec):
    """The trainer processes (pods); several ranks shard the policy with FSDP2."""

    replicas: Int = Field(
        2,
        ge=1,
        le=MAX_REPLICAS,
        description="Trainer ranks (processes, pods): the policy is sharded over them (FSDP2).",
    )
    micro_batch_tokens: Int | None = Field(
        None,
        ge=1,
        le=100_000_000,
        description="Tokens (prompt + completion) per forward and backward pass; null: the "
        "whole batch at once. The step is the full batch's either way (gradient accumulation).",
    )
    pack_sequences: Bool = Field(
        True,
        description="Run each micro-batch's sequences as one row without padding (attention "
        "kept within each sequence).",
    )
    activation_checkpointing: Bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass instead of "
        "keeping them: less memory, about a third more compute.",
    )


class PodSecuritySpec(_Model):
    """The run's pods' user, where it differs from the operator's setting (the chart's
    podSecurity.runAsUser)."""

    run_as_user: Int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="The user (also group and fsGroup) ID the run's pods run as; null: none, the "
        "platform assigns them (OpenShift's restricted-v2 refuses pods that name their own).",
    )


class CheckpointSpec(_Model):
    """Where and how often checkpoints are written; a restart resumes from the newest."""

    claim_name: str | None = Field(
        None, min_length=1, description="PVC holding checkpoints in the cluster."
    )
    every_steps: Int = Field(
        100, ge=1, le=MAX_STEPS, description="Write a checkpoint every N steps."
    )
    keep: Int = Field(2, ge=1, le=1000, description="Newest checkpoints kept.")
    create_run_directory: Bool = Field(
        False,
        description="Before each pod starts, an init container creates runs/<run> on the claim "
        "as the pods' user. For claims that ignore fsGroup (many NFS provisioners), where the "
        "kubelet would create it owned by root and the trainer could not write its checkpoints; "
        "the claim's runs/ must be writable by the pods' user.",
    )


# --- experiment trackers (scalerl.tracking) ------------------------------------------------------


class MlflowTracking(_Model):
    uri: str | None = Field(
        None,
        min_length=1,
        description="MLflow tracking URI (http://host:5000, sqlite:///path.db); null: "
        "MLFLOW_TRACKING_URI from the environment.",
    )
    experiment: str = Field(
        "scalerl", min_length=1, description="MLflow experiment the run's MLflow run goes in."
    )


class TensorboardTracking(_Model):
    dir: str = Field(
        "tensorboard",
        min_length=1,
        description="Folder of the event files; relative to the run directory. The run writes "
        "into <dir>/<run name>.",
    )


class WandbTracking(_Model):
    project: str = Field("scalerl", min_length=1, description="W&B project.")
    entity: str | None = Field(None, min_length=1, description="W&B entity; null: the default.")
    mode: Literal["online", "offline", "disabled"] = Field(
        "online",
        description="online: sync as it runs (WANDB_API_KEY); offline: files in the run "
        "directory's wandb/ folder, `wandb sync` later; disabled: nothing.",
    )


class TrackioTracking(_Model):
    project: str = Field("scalerl", min_length=1, description="trackio project.")


class SecretRef(_Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the run's namespace.")


class HubTokenSecret(_Model):
    name: str = Field(min_length=1, max_length=253, description="Secret in the run's namespace.")
    key: str = Field(
        "HF_TOKEN", min_length=1, max_length=253, description="The Secret's key holding the token."
    )


class HubSpec(_Model):
    """How a cluster's initializer Job reads the run's hf:// ids (locally: HF_TOKEN and
    HF_ENDPOINT from the environment)."""

    token_secret: HubTokenSecret | None = Field(
        None,
        description="On a cluster: the Secret (and key) whose value is HF_TOKEN of the "
        "initializer Job alone, which downloads the hf:// sources; the training pods never hold "
        "it. Null: no token (public repos).",
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        description="On a cluster: the Hub the initializer downloads from (HF_ENDPOINT: a "
        "self-hosted mirror); null: huggingface.co.",
    )


class VerifiersEnvironment(_Model):
    """A verifiers environment package (the classic API of verifiers 0.3.1), as prime-rl loads
    it: the same package, unchanged."""

    id: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_.\-/]+$",
        description="Its id (tool-arith imports the module tool_arith), loaded with verifiers' "
        "own load_environment; the package must be installed where the generators run.",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of its load_environment."
    )


class OpenEnvEnvironment(_Model):
    """An OpenEnv environment server (reset/step over HTTP and WebSocket) the rollouts drive
    through scalerl's adapter; the prompts come from spec.data.train (each row goes to reset)."""

    app: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="The server's ASGI app as module:attribute: a local run starts it on "
        "127.0.0.1 and stops it with the run.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        description="The server's image: on a cluster the operator runs it as a Deployment "
        "and Service of the run (removed with it).",
    )
    url: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        description="A server already running (http://host:port); nothing is started.",
    )
    port: Int = Field(8000, ge=1, le=65535, description="The port the server listens on.")
    replicas: Int = Field(
        1, ge=1, le=MAX_REPLICAS, description="On a cluster: server pods behind the Service."
    )

    @model_validator(mode="after")
    def _somewhere(self) -> OpenEnvEnvironment:
        if self.app is None and self.image is None and self.url is None:
            raise ValueError("set app (local), image (cluster) or url (a running server)")
        return self


class EnvironmentSpec(_Model):
    """Multi-turn and tool-use rollouts from an environment users already have, instead of
    data.train + data.reward: its dataset gives the prompts, its rubric the reward."""

    verifiers: VerifiersEnvironment | None = Field(
        None, description="A verifiers environment package (its dataset, eval split, rubric)."
    )
    openenv: OpenEnvEnvironment | None = Field(
        None, description="An OpenEnv server; the prompts come from data.train."
    )
    pass_threshold: Float = Field(
        0.5,
        ge=-1e9,
        le=1e9,
        description="A rollout passes (pass rate, curriculum, the fit) when its reward is at "
        "least this and it was not truncated; the advantage uses the reward itself.",
    )
    max_turns: Int = Field(
        8, ge=1, le=1000, description="Model turns per rollout at most (with the env's own)."
    )
    tool_timeout_seconds: Float = Field(
        30.0,
        gt=0,
        le=86_400,
        description="Wall time of one tool call; past it the model reads a tool error.",
    )
    max_tool_output_chars: Int = Field(
        8192,
        ge=16,
        le=1 << 24,
        description="A tool's or the environment's message is cut to this many characters "
        "(the cut is said in the message) before it is tokenized.",
    )
    rollout_timeout_seconds: Float = Field(
        600.0,
        gt=0,
        le=86_400,
        description="Wall time of one rollout; past it the rollout is dropped and counted.",
    )
    packages: list[str] = Field(
        default_factory=list,
        description="On a cluster: pip requirements (the environment package) installed into "
        "the generator pods at start, from the cluster's package index; or build an image FROM "
        "scalerl's and leave this empty.",
    )
    index_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s]+$",
        description="The package index `packages` are installed from; null: pip's default.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> EnvironmentSpec:
        if (self.verifiers is None) == (self.openenv is None):
            raise ValueError("set exactly one of verifiers and openenv")
        return self


class TrackingSpec(_Model):
    """Experiment trackers the trainer (steps, evaluations) and the fit (A, B, C_mid) log to:
    one tracker run per ScaleRLRun, the same one after a restart."""

    mlflow: MlflowTracking | None = Field(None, description="Log to MLflow.")
    tensorboard: TensorboardTracking | None = Field(None, description="Write TensorBoard files.")
    wandb: WandbTracking | None = Field(None, description="Log to Weights & Biases.")
    trackio: TrackioTracking | None = Field(None, description="Log to trackio (local-first).")
    secret_ref: SecretRef | None = Field(
        None,
        description="On a cluster: a Secret whose keys become environment variables of the pods "
        "that log (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...). Locally the environment is used.",
    )

    @property
    def trackers(self) -> list[str]:
        """The trackers switched on, by name."""
        return [n for n in ("mlflow", "tensorboard", "wandb", "trackio") if getattr(self, n)]


class RunSpec(_Model):
    model: ModelSpec
    data: DataSpec = Field(
        DataSpec(),
        description="The prompts and their reward (data.train), or, with environment, what the "
        "environment does not give.",
    )
    environment: EnvironmentSpec | None = Field(
        None,
        description="Multi-turn and tool-use rollouts from a verifiers environment or an "
        "OpenEnv server instead of data.train + data.reward (README: Agents and tools).",
    )
    recipe: RecipeSpec = RecipeSpec()
    evaluation: EvaluationSpec = EvaluationSpec()
    fit: FitSpec = FitSpec()
    budget: BudgetSpec = BudgetSpec()
    generators: GeneratorsSpec = GeneratorsSpec()
    trainers: TrainersSpec = TrainersSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    failure_policy: FailurePolicySpec = FailurePolicySpec()
    placement: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="disaggregated: a process (pod) per trainer rank and generator, weights "
        "broadcast. colocated: one process (pod) holds the trainer and one vLLM engine, which "
        "share its device; weights move in memory.",
    )
    scheduling: RunSchedulingSpec = Field(
        RunSchedulingSpec(),
        description="Where the run's pods may run (trainers and generators), and its queue.",
    )
    pod_security: PodSecuritySpec | None = Field(
        None, description="Absent: the pods run as the operator is set up to run them."
    )
    suspend: Bool = Field(
        False,
        description="true: the pods go and the checkpoints stay (compute clock stopped); false "
        "resumes from them.",
    )
    seed: Int = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description="The run's random seed: sampling, held-out evaluations, a fresh adapter.",
    )
    tracking: TrackingSpec | None = Field(
        None, description="Experiment trackers (MLflow, TensorBoard, W&B, trackio); null: none."
    )
    hub: HubSpec = Field(
        HubSpec(),
        description="On a cluster: the token Secret and mirror the initializer Job reads hf:// "
        "ids with.",
    )

    @model_validator(mode="after")
    def _thinking_consistent(self) -> RunSpec:
        if self.model.think_end is None and self.recipe.length.interruption.enabled:
            raise _at(
                "recipe.length.interruption.enabled",
                "must be false when model.thinkEnd is null (a model that does not think "
                "cannot be interrupted)",
            )
        return self

    @model_validator(mode="after")
    def _prompts_from_one_place(self) -> RunSpec:
        env, train = self.environment, self.data.train
        if env is None and train is None:
            raise _at("data.train", "required (or give spec.environment)")
        if env is not None and env.verifiers is not None and train is not None:
            raise _at(
                "data.train",
                "must be absent with environment.verifiers: the environment's dataset gives "
                "the prompts",
            )
        if env is not None and env.openenv is not None and train is None:
            raise _at("data.train", "required with environment.openenv: it gives the prompts")
        return self

    @model_validator(mode="after")
    def _colocated_is_one_process(self) -> RunSpec:
        if self.placement != "colocated":
            return self
        one = "must be 1 with placement colocated (one process holds the trainer and the engine)"
        for field, value in (
            ("trainers.replicas", self.trainers.replicas),
            ("generators.replicas", self.generators.replicas),
            ("generators.tensorParallel", self.generators.tensor_parallel),
        ):
            if value != 1:
                raise _at(field, f"{one}; got {value}")
        if self.trainers.gpus > 1:
            raise _at(
                "trainers.gpus",
                f"must be 0 or 1 with placement colocated; got {self.trainers.gpus}",
            )
        if self.generators.gpus != self.trainers.gpus:
            raise _at(
                "generators.gpus",
                f"must equal trainers.gpus ({self.trainers.gpus}) with placement colocated: the "
                f"engine shares the trainer's device; got {self.generators.gpus}",
            )
        return self

    @model_validator(mode="after")
    def _warmup_within_budget(self) -> RunSpec:
        optimizer, steps = self.recipe.optimizer, self.budget.max_steps
        if optimizer.warmup_steps <= steps:
            return self
        default = "" if "warmup_steps" in optimizer.model_fields_set else " (the default)"
        raise _at(
            "recipe.optimizer.warmupSteps",
            f"{optimizer.warmup_steps}{default} is more than budget.maxSteps {steps}: the "
            f"learning rate would still be rising when the run ends and never reach lr "
            f"{optimizer.lr:g}; set warmupSteps to {steps} or less",
        )

    @model_validator(mode="after")
    def _a_fit_can_be_made(self) -> RunSpec:
        """Refuse a compute floor or an evaluation schedule that leaves no fit possible: the
        run would train to its end and never say where it is heading."""
        floor, budget = self.fit.min_compute, self.budget
        if floor is not None and floor >= budget.max_compute_hours:
            raise _at(
                "fit.minCompute",
                f"must be below budget.maxComputeHours ({budget.max_compute_hours:g}): every "
                f"evaluation would lie below it and no fit could be made; got {floor:g}",
            )
        every = self.evaluation.every_steps
        count = len(evaluation_steps(budget.max_steps, every, self.recipe.steps_per_round))
        # A floor of 0 keeps the step-0 evaluation as a point; any other floor excludes it.
        needed = FIT_MIN_POINTS + (floor != 0)
        if count < needed:
            raise _at(
                "evaluation.everySteps",
                f"{every} gives {count} evaluations within budget.maxSteps {budget.max_steps} "
                f"(step 0, every {every} steps, the last step{_rounds(self.recipe)}); a fit "
                f"needs {needed} with "
                f"fit.minCompute {'null' if floor is None else f'{floor:g}'} (and a prediction "
                f"{PREDICTION_MIN_POINTS} past step 0): evaluate more often",
            )
        return self

    @property
    def colocated(self) -> bool:
        return self.placement == "colocated"

    @property
    def thinks(self) -> bool:
        return self.model.think_end is not None

    @property
    def interruption_phrase(self) -> str:
        phrase = self.recipe.length.interruption.phrase
        return phrase if phrase is not None else f"{INTERRUPTION_TEXT} {self.model.think_end}"

    @property
    def max_completion_tokens(self) -> int:
        """The completion budget: thinking + answer, or the answer alone without thinking."""
        length = self.recipe.length
        return length.max_completion_tokens if self.thinks else length.answer_budget

    @property
    def ranks_per_trainer(self) -> int:
        """Trainer ranks in one trainer replica on a cluster: one per GPU, one on CPU."""
        return max(1, self.trainers.gpus)

    @property
    def processes(self) -> int:
        """Processes (pods) of the run: a CPU run's compute units, in process-hours."""
        return 1 if self.colocated else self.trainers.replicas + self.generators.replicas

    @property
    def cluster_compute_units(self) -> int:
        """What compute counts, on a cluster and locally: GPUs, or processes for a CPU run."""
        return self.compute_units or self.processes

    @property
    def compute_unit(self) -> str:
        """The unit of this run's compute, as every line, column and axis names it."""
        return "GPU-hours" if self.compute_units else "process-hours"

    @property
    def compute_units(self) -> int:
        """GPUs of the whole run (generators + trainers); compute = wall hours x this."""
        if self.colocated:  # trainer and engine share one pod's devices
            return self.trainers.gpus
        return self.generators.replicas * self.generators.gpus + self.trainers.replicas * (
            self.trainers.gpus
        )


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    namespace: str | None = None


class _Resource(BaseModel):
    """A scalerl.dev object: its apiVersion, kind and metadata as Kubernetes has them.

    Nothing else may stand at the top: a block indented one level too little (`budget:` at
    column 0) would otherwise be dropped without a word and the run get the defaults. Kubernetes'
    own additions live in metadata (which allows them) and in status (which parsing skips)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    api_version: Literal["scalerl.dev/v1alpha1"] = Field(alias="apiVersion")
    metadata: Metadata

    @property
    def name(self) -> str:
        return self.metadata.name


class ScaleRLRun(_Resource):
    kind: Literal["ScaleRLRun"]
    spec: RunSpec

    @model_validator(mode="after")
    def _name_is_dns_label(self) -> ScaleRLRun:
        name = self.metadata.name
        if len(name) > 63 or not _DNS_LABEL.match(name):
            raise ValueError(f"metadata.name {name!r} must be a DNS-1123 label (a-z, 0-9, '-')")
        return self

    @property
    def namespace(self) -> str:
        """metadata.namespace, or "local" for a run without one (a local run)."""
        return self.metadata.namespace or "local"

    @property
    def queue_name(self) -> str | None:
        """The Kueue LocalQueue the gang is admitted through: `spec.scheduling.queueName`, else
        the run's label kueue.x-k8s.io/queue-name; None: no queue (pods scheduled as they come)."""
        labels = (self.metadata.model_extra or {}).get("labels") or {}
        label = labels.get(QUEUE_LABEL) if isinstance(labels, dict) else None
        return self.spec.scheduling.queue_name or (str(label) if label else None)


# --- a sweep: variants of one run, compared the paper's way --------------------------------------

SWEEP_KIND = "ScaleRLSweep"
# A variant's phase in a sweep's leaderboard, locally and on a cluster alike.
VARIANT_PHASES = PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED = (
    "Pending",
    "Running",
    "Stopped",
    "Succeeded",
    "Failed",
)
# A variant's run is "<sweep>-<variant>": short names leave room for the run's own children.
MAX_VARIANT_NAME = 20
VariantName = Annotated[
    str, Field(min_length=1, max_length=MAX_VARIANT_NAME, pattern=_DNS_LABEL.pattern)
]


class VariantSpec(_Model):
    """One variant of the sweep: its name and its patch of spec.base."""

    name: VariantName = Field(description="The variant; its run is <sweep>-<name>.")
    patch: dict[str, Any] = Field(
        default_factory=dict,
        description="A JSON merge patch of spec.base (RFC 7386: null removes a field, so its "
        "default applies).",
    )


class EarlyStopSpec(_Model):
    """Stop a variant that cannot win: measured clearly below the best variant at the same
    compute, and its ceiling below the best one's floor (`scalerl.fit.earlystop`); the rest of
    its budget is saved."""

    min_points: Int = Field(
        PREDICTION_MIN_POINTS,
        ge=PREDICTION_MIN_POINTS,
        le=10_000,
        description="Judge a variant (and count one as the yardstick) only once it has this "
        f"many trained evaluations past fit.minCompute (at least {PREDICTION_MIN_POINTS}: a "
        "fit of fewer is TooEarly, and its bootstrap interval for A can be far too narrow).",
    )


class SweepSpec(_Model):
    base: dict[str, Any] = Field(description="The ScaleRLRun spec every variant starts from.")
    variants: list[VariantSpec] = Field(min_length=1, max_length=100)
    max_parallel: Int = Field(2, ge=1, le=100, description="Variants running at once.")
    early_stop: EarlyStopSpec | None = Field(
        EarlyStopSpec(), description="null: every variant runs to its budget."
    )

    @model_validator(mode="after")
    def _names_unique(self) -> SweepSpec:
        names = [v.name for v in self.variants]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise _at("variants", f"names must be unique; repeated: {', '.join(twice)}")
        return self


class ScaleRLSweep(_Resource):
    kind: Literal["ScaleRLSweep"]
    spec: SweepSpec

    def variant_runs(self) -> dict[str, ScaleRLRun]:
        """Each variant's run, by variant name: spec.base with the variant's patch, named
        <sweep>-<variant>. SpecError names every problem, variant by variant."""
        runs, problems = {}, []
        for i, variant in enumerate(self.spec.variants):
            obj = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": f"{self.name}-{variant.name}"}
                | ({"namespace": self.metadata.namespace} if self.metadata.namespace else {}),
                "spec": patched(self.spec.base, variant.patch),
            }
            where = f"spec.variants.{i} ({variant.name}): "
            try:
                runs[variant.name] = parse_run(obj)
            except SpecError as err:
                problems += [where + problem for problem in err.problems]
                continue
            first = next(iter(runs.values()))
            problems += [where + p for p in _protocol_changes(first, runs[variant.name])]
        if problems:
            raise SpecError(problems)
        return runs


def patched(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A variant's run spec: `base` with `patch` merged (RFC 7386), except that a patch naming
    another loss type replaces the loss block (a tagged union: the base loss's own fields, such
    as cispo's epsilonMax, mean nothing to another loss)."""
    spec = merge_patch(base, patch)
    loss, base_loss = _loss_block(patch), _loss_block(base)
    if isinstance(loss, dict) and "type" in loss and loss["type"] != (base_loss or {}).get("type"):
        spec["recipe"]["loss"] = merge_patch({}, loss)
    return dict(spec)


def _loss_block(spec: dict[str, Any]) -> Any:
    recipe = spec.get("recipe")
    return recipe.get("loss") if isinstance(recipe, dict) else None


def _protocol_changes(first: ScaleRLRun, run: ScaleRLRun) -> list[str]:
    """How `run` evaluates otherwise than the sweep's first variant: its pass rates would not be
    comparable (other prompts, another k, another model), so neither its rank nor a stop."""
    a, b = first.spec, run.spec
    differs = {
        "data.validation": a.data.validation != b.data.validation,
        "evaluation.generationsPerPrompt": a.evaluation.generations_per_prompt
        != b.evaluation.generations_per_prompt,
        "model": a.model != b.model,
    }
    return [
        f"spec.{name}: a sweep's variants share the evaluation protocol (their pass rates are "
        f"compared); this variant changes it from the first variant's"
        for name, changed in differs.items()
        if changed
    ]


def merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as a JSON merge patch (RFC 7386); `target` is not changed."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- parsing at the edge -------------------------------------------------------------------------


def parse_run(obj: Any) -> ScaleRLRun:
    """Validate a ScaleRLRun object (a dict as from YAML); SpecError lists every bad field."""
    if not isinstance(obj, dict):
        raise SpecError([f"a ScaleRLRun must be a mapping, got {type(obj).__name__}"])
    obj = {k: v for k, v in obj.items() if k != "status"}
    try:
        return ScaleRLRun.model_validate(obj)
    except ValidationError as err:
        raise SpecError(_problems(err, ScaleRLRun)) from None


def parse_sweep(obj: Any) -> ScaleRLSweep:
    """Validate a ScaleRLSweep and every variant's run; SpecError lists every bad field."""
    if not isinstance(obj, dict):
        raise SpecError([f"a ScaleRLSweep must be a mapping, got {type(obj).__name__}"])
    obj = {k: v for k, v in obj.items() if k != "status"}
    try:
        sweep = ScaleRLSweep.model_validate(obj)
    except ValidationError as err:
        raise SpecError(_problems(err, ScaleRLSweep)) from None
    sweep.variant_runs()
    return sweep


def load_sweep(path: str | Path) -> ScaleRLSweep:
    """Read and validate a YAML file holding one ScaleRLSweep."""
    return _load(path, parse_sweep)


def load_run(path: str | Path) -> ScaleRLRun:
    """Read and validate a YAML file holding one ScaleRLRun."""
    return _load(path, parse_run)


def _load(path: str | Path, parse: Callable[[Any], T]) -> T:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise InputError(f"{path}: cannot read spec file ({err.strerror})") from None
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InputError(f"{path}: not valid YAML ({err})") from None
    try:
        return parse(obj)
    except SpecError as err:
        raise SpecError([f"{path}: {p}" for p in err.problems]) from None


def _problems(err: ValidationError, kind: type[_Resource]) -> list[str]:
    """One line per problem; a key at the top level that is not one of the object's is named
    with where it belongs, when that is clear."""
    return [
        _misplaced(str(e["loc"][0]), kind)
        if e["type"] == "extra_forbidden" and len(e["loc"]) == 1
        else _describe(e)
        for e in err.errors()
    ]


def _misplaced(key: str, kind: type[_Resource]) -> str:
    """`key` at the top of a `kind` document, and the field it most likely meant."""
    where = _home_of(key, kind)
    hint = f"; did you mean {where}? (move it under {where.rpartition('.')[0]})" if where else ""
    return (
        f"{key}: not a top-level field of a {kind.__name__} (those are apiVersion, kind, "
        f"metadata, spec and status){hint}"
    )


def _home_of(key: str, kind: type[_Resource]) -> str | None:
    """Where `key` (in any case, camelCase or snake_case) is a field below the top, or None."""
    spec: Any = kind.model_fields["spec"].annotation
    homes = [("metadata", ["name", "namespace", "labels", "annotations"]), ("spec", _fields(spec))]
    if kind is ScaleRLSweep:  # a run's fields belong in the sweep's base
        homes.append(("spec.base", _fields(RunSpec)))
    wanted = key.replace("_", "").lower()
    for prefix, fields in homes:
        for field in fields:
            if field.lower() == wanted:
                return f"{prefix}.{field}"
    return None


def _fields(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _describe(error: Any) -> str:
    """One line per problem: the field's YAML path, then what is wrong and what is allowed."""
    loc = [str(p) for p in error["loc"] if not _is_variant_tag(p, error)]
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "union_tag_invalid":
        loc.append(ctx["discriminator"].strip("'"))
        return f"{'.'.join(loc)}: {ctx['tag']!r} is not one of {', '.join(LOSS_TYPES)}"
    if kind == "union_tag_not_found":
        loc.append(ctx["discriminator"].strip("'"))
        return f"{'.'.join(loc)}: required field is missing (one of {', '.join(LOSS_TYPES)})"
    if kind == "literal_error":
        allowed = ctx["expected"].replace("'", "").replace(" or ", ", ")
        return f"{'.'.join(loc)}: {value!r} is not one of {allowed}"
    if kind == "extra_forbidden":
        return f"{'.'.join(loc)}: unknown field (check spelling; fields are camelCase)"
    if kind == "missing":
        return f"{'.'.join(loc)}: required field is missing"
    message = error["msg"].removeprefix("Value error, ")
    where = ".".join(loc) or "object"
    if message.startswith(_AT):  # a model validator naming a field below its model
        below, _, message = message[len(_AT) :].partition(": ")
        where = f"{where}.{below}"
    return f"{where}: {message}" + ("" if kind == "value_error" else f", got {value!r}")


def _is_variant_tag(part: Any, error: Any) -> bool:
    # pydantic puts the chosen union member's tag in the location ("loss.cispo.epsilonMax").
    if part in (_FILE, _SOURCES):
        return True
    return isinstance(part, str) and part in LOSS_TYPES and error["type"] != "union_tag_invalid"
