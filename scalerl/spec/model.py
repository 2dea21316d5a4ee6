"""The model trained: its weights, dtype, end-of-thinking marker and an optional LoRA adapter."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from scalerl.spec.base import Bool, Float, Int, _Model

THINK_END = "</think>"


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
