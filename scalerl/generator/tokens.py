"""The model's own special tokens, and the answer part of a completion.

Everything comes from the model folder: EOS ids from its tokenizer and its generation config
(which may list several), the end-of-thinking id from `spec.model.thinkEnd` as the tokenizer
encodes it. No token string is assumed. A reward sees the answer decoded without special tokens,
so EOS or pad text never reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scalerl.errors import DataError


@dataclass(frozen=True)
class ModelTokens:
    tokenizer: Any
    eos_ids: frozenset[int]
    think_end_id: int | None  # None: the model does not think

    @classmethod
    def load(cls, model_path: str | Path, tokenizer: Any, think_end: str | None) -> ModelTokens:
        return cls(tokenizer, eos_ids(model_path, tokenizer), think_end_id(tokenizer, think_end))

    def answer_ids(self, completion_ids: Sequence[int]) -> list[int]:
        """What follows the last end-of-thinking token (everything without thinking), less EOS.

        Empty when a thinking model never closed its thinking: such a completion has no answer.
        """
        ids = list(completion_ids)
        if self.think_end_id is not None:
            if self.think_end_id not in ids:
                return []
            ids = ids[len(ids) - ids[::-1].index(self.think_end_id) :]
        return [t for t in ids if t not in self.eos_ids]

    def answer_text(self, completion_ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(self.answer_ids(completion_ids), skip_special_tokens=True)
        return text.strip()


def eos_ids(model_path: str | Path, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's."""
    ids = set() if tokenizer.eos_token_id is None else {int(tokenizer.eos_token_id)}
    ids |= set(_generation_config_eos(Path(model_path)))
    if not ids:
        raise DataError(
            f"{model_path}: neither the tokenizer nor generation_config.json names an EOS token; "
            "a completion could never end"
        )
    return frozenset(ids)


def _generation_config_eos(model_path: Path) -> list[int]:
    from transformers import GenerationConfig

    if not (model_path / "generation_config.json").is_file():
        return []
    try:
        value = GenerationConfig.from_pretrained(str(model_path)).eos_token_id
    except (OSError, ValueError) as err:
        raise DataError(f"{model_path}/generation_config.json: cannot read it ({err})") from None
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def think_end_id(tokenizer: Any, think_end: str | None) -> int | None:
    """The single id of the end-of-thinking marker, or None for a model that does not think."""
    if think_end is None:
        return None
    ids = tokenizer.encode(think_end, add_special_tokens=False)
    if len(ids) != 1:
        raise DataError(
            f"spec.model.thinkEnd: {think_end!r} is {len(ids)} tokens for this tokenizer; it must "
            "be a single token (add it to the tokenizer, or set thinkEnd: null for a model that "
            "does not think)"
        )
    return int(ids[0])
