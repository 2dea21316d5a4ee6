"""A tiny Llama, randomly initialised and saved in Hugging Face format, for tests and the built-ins.

Llama (not Qwen2) because `AutoTokenizer` keeps spaces with a character tokenizer for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# torch and transformers are imported where a model is built: resolving a built-in whose model is
# already cached reads only `TinyModelShape` (its cache key), and must not pay their ~10 s import.
if TYPE_CHECKING:
    import torch
    from transformers import LlamaConfig, PreTrainedTokenizerBase


@dataclass(frozen=True)
class TinyModelShape:
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 512
    max_positions: int = 512
    kv_heads: int | None = None  # None: as many as `heads` (no grouped-query attention)


def _config(
    shape: TinyModelShape,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: list[int],
    dtype: torch.dtype,
) -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads or shape.heads,
        max_position_embeddings=shape.max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype=dtype,
    )


def build_random_model(
    path: Path,
    *,
    shape: TinyModelShape = TinyModelShape(),
    dtype: torch.dtype | None = None,
    seed: int = 0,
    tokenizer: PreTrainedTokenizerBase | None = None,
    eos_ids: Sequence[int] | None = None,
) -> Path:
    """Write a randomly initialised tiny Llama with `tokenizer` (default: the demo's) to `path`.

    `eos_ids` (default: the tokenizer's EOS) go into `config.json` and `generation_config.json`,
    which is where a model that ends its turns with another token than its tokenizer's EOS says so.
    `dtype` defaults to float32.
    """
    import torch
    from transformers import LlamaForCausalLM

    from scalerl.demo.tokenizer import build_tokenizer

    dtype = torch.float32 if dtype is None else dtype
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    # The chat template (if any) goes into tokenizer_config.json, as most published models have it.
    tokenizer.save_pretrained(str(path), save_jinja_files=False)
    ends = list(eos_ids) if eos_ids is not None else [int(tokenizer.eos_token_id)]
    config = _config(shape, tokenizer, ends, dtype)
    torch.manual_seed(seed)
    # Its generation config is derived from `config`, EOS list included.
    model = LlamaForCausalLM(config).to(dtype)  # type: ignore[arg-type]  # transformers wraps `to`
    model.save_pretrained(str(path), safe_serialization=True)
    return path
