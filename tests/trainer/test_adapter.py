"""LoRA on the trainer: the adapter layers found from the model, only the adapter trains, and the
adapter alone travels, is checkpointed and resumes; the checkpoint is an adapter PEFT loads."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, Phi3Config, Phi3ForCausalLM

from scalerl.demo.tokenizer import save_tokenizer
from scalerl.errors import DataError, InputError
from scalerl.rollout.records import RolloutGroup
from scalerl.spec import LoraSpec
from scalerl.trainer import (
    Batch,
    Policy,
    StepSettings,
    build_batch,
    build_optimizer,
    load_checkpoint,
    load_policy,
    save_checkpoint,
    train_step,
)
from scalerl.trainer.adapter import decoder_linear_names

Factory = Callable[..., RolloutGroup]
LORA = LoraSpec(rank=4, alpha=8)
CISPO = StepSettings("cispo", "prompt", epsilon_max=4.0, epsilon_low=0.2, epsilon_high=0.28)
LLAMA_LAYERS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def batch_of(make_group: Factory, policy: Policy) -> Batch:
    groups = [
        make_group([1.0, -1.0, 1.0, -1.0], lengths=[4, 7, 3, 5], prompt_length=3, seed=s)
        for s in (1, 2)
    ]
    batch, _ = build_batch(groups, current_version=0, max_off_policy=None, pad_id=policy.pad_id)
    assert batch is not None
    with torch.no_grad():
        logprobs, _ = policy.completion_logprobs(batch)
    return replace(batch, old_logprobs=logprobs)


def trained(model_dir: Path, make_group: Factory, steps: int = 2) -> tuple[Policy, Batch, object]:
    policy = load_policy(model_dir, fp32_lm_head=True, lora=LORA)
    batch = batch_of(make_group, policy)
    optimizer, scheduler = build_optimizer(
        policy.parameters(), lr=1e-2, weight_decay=0.0, eps=1e-15, warmup_steps=0
    )
    for _ in range(steps):
        assert not train_step(policy, optimizer, scheduler, batch, CISPO).skipped
    return policy, batch, (optimizer, scheduler)


def test_the_adapted_layers_are_the_decoder_s_linear_layers_of_each_architecture(
    model_dir: Path, tmp_path: Path
) -> None:
    llama = AutoModelForCausalLM.from_pretrained(str(model_dir))
    assert decoder_linear_names(llama) == LLAMA_LAYERS
    # Phi-3 fuses q/k/v and gate/up: other names, found the same way, and not the head.
    phi = Phi3ForCausalLM(
        Phi3Config(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            pad_token_id=0,
        )  # fmt: skip
    )
    assert decoder_linear_names(phi) == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"]
    phi.save_pretrained(str(tmp_path / "phi"))
    save_tokenizer(tmp_path / "phi")
    policy = load_policy(tmp_path / "phi", fp32_lm_head=True, lora=LORA)
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name, _ in policy.named_weights()}
    assert adapted == {"down_proj", "gate_up_proj", "o_proj", "qkv_proj"}


def test_a_fresh_adapter_is_the_base_and_only_the_adapter_trains(
    model_dir: Path, make_group: Factory
) -> None:
    base = load_policy(model_dir, fp32_lm_head=True)
    fresh = load_policy(model_dir, fp32_lm_head=True, lora=LORA)
    batch = batch_of(make_group, base)
    with torch.no_grad():
        torch.testing.assert_close(fresh.completion_logprobs(batch)[0], batch.old_logprobs)
    before = {n: p.detach().clone() for n, p in fresh.model.named_parameters()}
    policy, batch, _ = trained(model_dir, make_group)
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable
    assert all(".lora_" in n for n in trainable)  # the base, FP32 head included, is frozen
    assert all(
        p.dtype == torch.float32 for n, p in policy.model.named_parameters() if n in trainable
    )
    with torch.no_grad():
        after, _ = policy.completion_logprobs(batch)
    change = torch.where(batch.loss_mask, after - batch.old_logprobs, 0.0).sum(dim=-1)
    assert bool((change[batch.advantages > 0] > 0).all())


def test_what_travels_is_the_adapter_alone(model_dir: Path, bf16_model_dir: Path) -> None:
    full = dict(load_policy(bf16_model_dir, dtype="bfloat16", fp32_lm_head=True).named_weights())
    policy = load_policy(bf16_model_dir, dtype="bfloat16", fp32_lm_head=True, lora=LORA)
    sent = dict(policy.named_weights())
    assert sent and all(".lora_A." in n or ".lora_B." in n for n in sent)
    # Sent in the body's dtype, as full weights are; kept in float32 for the checkpoint.
    assert {t.dtype for t in sent.values()} == {torch.bfloat16}
    assert {t.dtype for _, t in policy.named_weights(cast=False)} == {torch.float32}
    size = sum(t.numel() * t.element_size() for t in sent.values())
    whole = sum(t.numel() * t.element_size() for t in full.values())
    # Rank 4 on 64-wide layers: 2 x 4 x (in + out) per layer against in x out.
    assert size < whole / 5


def test_a_checkpoint_holds_the_adapter_and_resumes_it(
    model_dir: Path, make_group: Factory, tmp_path: Path
) -> None:
    policy, batch, (optimizer, scheduler) = trained(model_dir, make_group)
    path = save_checkpoint(tmp_path, 2, policy=policy, optimizer=optimizer,
                           scheduler=scheduler, state={"step": 2})  # fmt: skip
    files = {p.name for p in path.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= files
    assert "model.safetensors" not in files  # not the base
    config = json.loads((path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    assert sorted(config["target_modules"]) == LLAMA_LAYERS
    with torch.no_grad():
        expected, _ = policy.completion_logprobs(batch)
    # PEFT itself loads it onto the base and computes what the trainer does.
    base = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    peft = PeftModel.from_pretrained(base, str(path)).eval()
    with torch.no_grad():
        logits = peft(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    rows = torch.arange(batch.samples)[:, None]
    targets = batch.input_ids.gather(1, batch.completion_positions)
    direct = logits.log_softmax(-1)[rows, batch.completion_positions - 1, targets]
    torch.testing.assert_close(direct[batch.loss_mask], expected[batch.loss_mask], atol=1e-5,
                               rtol=0)  # fmt: skip
    # Resumed into a fresh policy: the same adapter, the same optimizer state, the same next step.
    again = load_policy(model_dir, fp32_lm_head=True, lora=LORA)
    opt2, sched2 = build_optimizer(again.parameters(), lr=1e-2, weight_decay=0.0, eps=1e-15,
                                   warmup_steps=0)  # fmt: skip
    load_checkpoint(path, policy=again, optimizer=opt2, scheduler=sched2)
    for (name, a), (_, b) in zip(policy.named_weights(cast=False), again.named_weights(cast=False),
                                 strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    train_step(policy, optimizer, scheduler, batch, CISPO)
    train_step(again, opt2, sched2, batch, CISPO)
    for (_, a), (_, b) in zip(policy.named_weights(cast=False), again.named_weights(cast=False),
                              strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_an_adapter_of_another_shape_is_refused_naming_it(
    model_dir: Path, make_group: Factory, tmp_path: Path
) -> None:
    policy, _, _ = trained(model_dir, make_group, steps=0)
    policy.save_adapter(tmp_path)
    wider = load_policy(model_dir, fp32_lm_head=True, lora=LoraSpec(rank=8))
    with pytest.raises(DataError, match="does not match model.lora"):
        wider.load_weights(tmp_path)
    with pytest.raises(DataError, match="cannot read the adapter"):
        wider.load_weights(tmp_path / "nowhere")


def test_bad_target_modules_are_refused(model_dir: Path) -> None:
    with pytest.raises(InputError, match="LM head"):
        load_policy(model_dir, fp32_lm_head=True, lora=LoraSpec(target_modules=["lm_head"]))
    with pytest.raises(DataError, match="targetModules"):
        load_policy(model_dir, fp32_lm_head=True, lora=LoraSpec(target_modules=["c_attn"]))


def test_adapter_dropout_acts_in_the_trainer_s_pass_only_when_asked(
    model_dir: Path, make_group: Factory
) -> None:
    def twice(dropout: float) -> tuple[torch.Tensor, torch.Tensor]:
        policy = load_policy(model_dir, fp32_lm_head=True, lora=LoraSpec(rank=4, dropout=dropout))
        with torch.no_grad():
            for name, parameter in policy.model.named_parameters():
                if ".lora_B." in name:
                    parameter.normal_(0.0, 0.1)
            batch = batch_of(make_group, policy)
            return policy.completion_logprobs(batch)[0], policy.completion_logprobs(batch)[0]

    first, second = twice(0.0)
    torch.testing.assert_close(first, second, atol=0, rtol=0)  # eval mode: one function
    first, second = twice(0.5)
    assert not torch.equal(first, second)  # the adapter's input dropped at random
