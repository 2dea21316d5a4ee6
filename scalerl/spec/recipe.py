"""The ScaleRL recipe: the loss, the curriculum, length budgets and interruption, batch, optimizer
and sampling; every field left out takes the paper's value."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from scalerl.spec.base import MAX_STEPS, MAX_TOKENS, Bool, Float, Int, _at, _Model
from scalerl.spec.model import THINK_END

# The paper's interruption sentence; the model's own end-of-thinking marker follows it.
INTERRUPTION_TEXT = "Okay, time is up. Let me stop thinking and formulate a final answer now."
INTERRUPTION_PHRASE = f"{INTERRUPTION_TEXT} {THINK_END}"


# The default ratio cap and clips; scalerl.recipe and the trainer take theirs from here.
EPSILON_MAX = 4.0  # CISPO's cap on the token ratio
EPSILON_LOW = 0.2  # DAPO's lower clip
EPSILON_HIGH = 0.28  # DAPO's upper clip
# recipe.correction's defaults (scalerl.recipe.correction): a ratio cap, and masking bounds.
CORRECTION_CAP = 2.0
CORRECTION_LOW = 0.5
CORRECTION_HIGH = 2.0


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
    """How the generators sample completions: for training and for the held-out evaluations
    alike. The trainer computes the log-probs of the same (tempered, filtered) distribution the
    generators record, so an unchanged policy's importance ratio is 1 (scalerl.recipe.sampling)."""

    temperature: Float = Field(
        1.0,
        ge=1e-5,
        le=10,
        description="Not stated in the paper; 1.0. At least 1e-5: below it vLLM samples greedily "
        "and records untempered log-probs, which no trainer temperature matches.",
    )
    top_p: Float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling: keep the most likely tokens whose probabilities add up to "
        "topP (1: off). Applies to training rollouts and evaluations; the trainer computes the "
        "same filtered distribution.",
    )
    top_k: Int = Field(
        0,
        ge=0,
        le=1 << 24,
        description="Keep the topK most likely tokens (0: off). Applies to training rollouts and "
        "evaluations; the trainer computes the same filtered distribution.",
    )
    min_p: Float = Field(
        0.0,
        ge=0,
        le=1,
        description="Drop tokens less likely than minP times the most likely one (0: off). "
        "Applies to training rollouts and evaluations; the trainer computes the same filtered "
        "distribution.",
    )

    @field_validator("top_k", mode="before")
    @classmethod
    def _off_is_zero(cls, value: Any) -> Any:
        # Before `ge=0`: vLLM's and others' "off" is -1, which is told what to write instead.
        if type(value) is int and value == -1:
            raise ValueError("must be >= 0: 0 turns top-k off (where vLLM also takes -1)")
        return value


class CorrectionSpec(_Model):
    """A correction for train-inference mismatch on the ratio every loss uses
    (scalerl.recipe.correction); none is the paper's setting (CISPO and an FP32 LM head)."""

    type: Literal["none", "truncate", "mask"] = Field(
        "none",
        description="none; truncate: the ratio capped at cap; mask: tokens or samples whose "
        "ratio leaves [low, high] get no loss.",
    )
    level: Literal["token", "sequence"] = Field(
        "token",
        description="token: each token's ratio; sequence: a sample's geometric-mean ratio, "
        "applied to all its tokens.",
    )
    cap: Float = Field(CORRECTION_CAP, ge=1, le=1000, description="truncate's cap on the ratio.")
    low: Float = Field(CORRECTION_LOW, gt=0, le=1, description="mask's lower bound on the ratio.")
    high: Float = Field(
        CORRECTION_HIGH, ge=1, le=1000, description="mask's upper bound on the ratio."
    )


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
    correction: CorrectionSpec = CorrectionSpec()

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
