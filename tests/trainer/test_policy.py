"""The policy wrapper: log-probs against a direct HF computation, the FP32 head, weights, errors."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from scalerl.demo.tokenizer import save_tokenizer
from scalerl.errors import DataError, InputError
from scalerl.recipe import SamplingFilters, filtered_logprobs, kept_tokens, token_entropy
from scalerl.rollout.records import RolloutGroup
from scalerl.trainer import Batch, build_batch, load_policy


def some_batch(make_group: Callable[..., RolloutGroup], pad_id: int) -> Batch:
    groups = [
        make_group([1.0, -1.0, 1.0], lengths=[4, 7, 1], prompt_length=2, seed=1),
        make_group([-1.0, 1.0], lengths=[6, 3], prompt_length=6, seed=2),
    ]
    batch, _ = build_batch(groups, current_version=0, max_off_policy=None, pad_id=pad_id)
    assert batch is not None
    return batch


def direct_logprobs(model_dir: Path, batch: Batch, temperature: float) -> torch.Tensor:
    """Reference: full HF forward, log_softmax over all logits, gather the completion tokens."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    predicting = (batch.completion_positions - 1).clamp(min=0)
    rows = torch.arange(batch.samples)[:, None]
    targets = batch.input_ids.gather(1, batch.completion_positions)
    return logprobs[rows, predicting, targets]


def safetensors_keys(directory: Path) -> dict[str, torch.dtype]:
    with safe_open(str(directory / "model.safetensors"), "pt") as handle:
        return {key: handle.get_tensor(key).dtype for key in handle.keys()}  # noqa: SIM118


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_direct_hf_computation(
    model_dir: Path, make_group: Callable[..., RolloutGroup], temperature: float
) -> None:
    policy = load_policy(model_dir, fp32_lm_head=False, temperature=temperature)
    batch = some_batch(make_group, policy.pad_id)
    logprobs, entropy = policy.completion_logprobs(batch)
    expected = direct_logprobs(model_dir, batch, temperature)
    mask = batch.loss_mask
    assert logprobs.dtype == torch.float32 and logprobs.shape == mask.shape
    torch.testing.assert_close(logprobs[mask], expected[mask], atol=1e-5, rtol=0)
    assert entropy.shape == mask.shape and not entropy.requires_grad
    assert bool((entropy[mask] > 0).all())


def test_fp32_head_gives_same_logprobs_in_float32(
    model_dir: Path, make_group: Callable[..., RolloutGroup]
) -> None:
    plain = load_policy(model_dir, fp32_lm_head=False)
    fp32 = load_policy(model_dir, fp32_lm_head=True)
    batch = some_batch(make_group, plain.pad_id)
    torch.testing.assert_close(
        fp32.completion_logprobs(batch)[0], plain.completion_logprobs(batch)[0], atol=1e-6, rtol=0
    )


def test_entropy_is_the_recipe_entropy_of_the_sampling_distribution(
    model_dir: Path, make_group: Callable[..., RolloutGroup]
) -> None:
    policy = load_policy(model_dir, fp32_lm_head=False, temperature=0.5)
    batch = some_batch(make_group, policy.pad_id)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    rows = torch.arange(batch.samples)[:, None]
    expected = token_entropy(logits[rows, batch.completion_positions - 1] / 0.5)
    _, entropy = policy.completion_logprobs(batch)
    torch.testing.assert_close(entropy[batch.loss_mask], expected[batch.loss_mask])


def test_bf16_body_with_fp32_head_computes_float32_logits(
    bf16_model_dir: Path, make_group: Callable[..., RolloutGroup]
) -> None:
    policy = load_policy(bf16_model_dir, dtype="bfloat16", fp32_lm_head=True)
    assert policy.head.weight.dtype == torch.float32
    assert policy.model.get_input_embeddings().weight.dtype == torch.bfloat16
    batch = some_batch(make_group, policy.pad_id)
    logprobs, entropy = policy.completion_logprobs(batch)
    assert logprobs.dtype == entropy.dtype == torch.float32
    logprobs[batch.loss_mask].sum().backward()
    assert policy.head.weight.grad is not None and policy.head.weight.grad.dtype == torch.float32


def test_bf16_body_without_fp32_head_keeps_head_in_bf16(
    bf16_model_dir: Path, make_group: Callable[..., RolloutGroup]
) -> None:
    policy = load_policy(bf16_model_dir, dtype="bfloat16", fp32_lm_head=False)
    assert policy.head.weight.dtype == torch.bfloat16
    batch = some_batch(make_group, policy.pad_id)
    logprobs, _ = policy.completion_logprobs(batch)
    assert logprobs.dtype == torch.float32  # upcast after the bf16 matmul


def test_named_weights_match_checkpoint_keys_in_model_dtype(bf16_model_dir: Path) -> None:
    policy = load_policy(bf16_model_dir, dtype="bfloat16", fp32_lm_head=True)
    weights = dict(policy.named_weights())
    stored = safetensors_keys(bf16_model_dir)
    assert set(weights) == set(stored)
    assert all(tensor.dtype == stored[name] for name, tensor in weights.items())
    assert all(not tensor.requires_grad for tensor in weights.values())
    head = weights["lm_head.weight"]
    assert head.dtype == torch.bfloat16
    torch.testing.assert_close(head, policy.head.weight.detach().to(torch.bfloat16))


def build_tied_model(path: Path) -> Path:
    tokenizer = save_tokenizer(path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        dtype=torch.bfloat16,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Tie explicitly: construction alone left them untied in some full-suite runs (transformers).
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(str(path))
    assert "lm_head.weight" not in safetensors_keys(path)
    return path


def test_tied_embeddings_share_the_fp32_head_and_feed_the_body_its_dtype(
    tmp_path: Path, make_group: Callable[..., RolloutGroup]
) -> None:
    path = build_tied_model(tmp_path / "tied")
    policy = load_policy(path, dtype="bfloat16", fp32_lm_head=True)
    embeddings = policy.model.get_input_embeddings()
    assert embeddings.weight is policy.head.weight and embeddings.weight.dtype == torch.float32
    logprobs, _ = policy.completion_logprobs(some_batch(make_group, policy.pad_id))
    assert bool(torch.isfinite(logprobs).all())
    weights = dict(policy.named_weights())
    assert set(weights) == set(safetensors_keys(path))
    assert weights["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_save_pretrained_keeps_the_fp32_head_exactly(bf16_model_dir: Path, tmp_path: Path) -> None:
    policy = load_policy(bf16_model_dir, dtype="bfloat16", fp32_lm_head=True)
    with torch.no_grad():
        policy.head.weight.add_(1e-6)  # a change bf16 cannot represent
    policy.save_pretrained(tmp_path / "saved")
    again = load_policy(tmp_path / "saved", dtype="bfloat16", fp32_lm_head=True)
    assert torch.equal(again.head.weight, policy.head.weight)
    assert (tmp_path / "saved" / "tokenizer.json").is_file()


def test_missing_path_raises_data_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match="nowhere.*does not exist"):
        load_policy(missing, fp32_lm_head=False)


def test_directory_without_config_raises_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"{tmp_path}.*config.json"):
        load_policy(tmp_path, fp32_lm_head=False)


def test_directory_without_weights_raises_data_error(model_dir: Path, tmp_path: Path) -> None:
    shutil.copy(model_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(DataError, match=f"{tmp_path}.*no weights"):
        load_policy(tmp_path, fp32_lm_head=False)


def test_corrupt_weights_raise_data_error(model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=f"cannot load the model in {broken}"):
        load_policy(broken, fp32_lm_head=False)


def test_unknown_dtype_raises_input_error(model_dir: Path) -> None:
    with pytest.raises(InputError, match="float64"):
        load_policy(model_dir, dtype="float64", fp32_lm_head=False)


def test_packed_sequences_score_as_padded_ones_and_chunks_change_nothing(
    model_dir: Path, make_group: Callable[..., RolloutGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = load_policy(model_dir, fp32_lm_head=True)
    batch = some_batch(make_group, policy.pad_id)
    padded, padded_entropy = policy.completion_logprobs(batch)
    packed, packed_entropy = policy.completion_logprobs(batch, packed=True)
    mask = batch.loss_mask
    torch.testing.assert_close(packed[mask], padded[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_entropy[mask], padded_entropy[mask], rtol=1e-5, atol=1e-5)
    # A chunk of 3 tokens: many chunks, each recomputed in the backward pass.
    monkeypatch.setattr("scalerl.trainer.policy.LOGIT_CHUNK", 3)
    chunked, _ = policy.completion_logprobs(batch, packed=True)
    torch.testing.assert_close(chunked[mask], padded[mask], rtol=1e-5, atol=1e-5)
    chunked[mask].sum().backward()
    assert all(p.grad is not None for p in policy.parameters() if p.requires_grad)


def test_sampling_filters_score_the_filtered_distribution_in_chunks_with_gradients(
    model_dir: Path, make_group: Callable[..., RolloutGroup], monkeypatch: pytest.MonkeyPatch
) -> None:
    filters = SamplingFilters(top_p=0.9, top_k=12, min_p=0.02)
    # Temperature 0.05 peaks the random model's near-uniform logits enough for the filters to act.
    policy = load_policy(model_dir, fp32_lm_head=True, temperature=0.05, filters=filters)
    batch = some_batch(make_group, policy.pad_id)
    mask = batch.loss_mask
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    rows = torch.arange(batch.samples)[:, None]
    tempered = logits[rows, batch.completion_positions - 1][mask] / 0.05
    targets = batch.input_ids.gather(1, batch.completion_positions)[mask]
    assert not bool(kept_tokens(tempered, filters).all()), "the filters must drop tokens here"
    expected, expected_entropy = filtered_logprobs(tempered.clone(), targets, filters)
    # A chunk of 3 tokens: many chunks, each recomputed in the backward pass.
    monkeypatch.setattr("scalerl.trainer.policy.LOGIT_CHUNK", 3)
    logprobs, entropy = policy.completion_logprobs(batch)
    torch.testing.assert_close(logprobs[mask], expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(entropy[mask], expected_entropy, atol=1e-4, rtol=0)
    plain = tempered.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    assert float((logprobs[mask] - plain).abs().max()) > 0.01  # the filters changed something
    logprobs[mask].sum().backward()
    grads = [p.grad for p in policy.parameters() if p.requires_grad]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
