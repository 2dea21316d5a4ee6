"""A tiny Llama, randomly initialised and saved in Hugging Face format, for tests and the demo.

Llama (not Qwen2) because `AutoTokenizer` keeps spaces with a character tokenizer for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scalerl.demo.tokenizer import save_tokenizer


@dataclass(frozen=True)
class TinyModelShape:
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 512
    max_positions: int = 512


def build_random_model(
    path: Path,
    *,
    shape: TinyModelShape = TinyModelShape(),
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Path:
    """Write a randomly initialised tiny Llama with the demo tokenizer to `path`; return `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = save_tokenizer(path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=shape.max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype=dtype,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(str(path), safe_serialization=True)
    return path
