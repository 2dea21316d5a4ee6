"""A character-level tokenizer built with the `tokenizers` library (no downloads).

Every printable ASCII character is one token, so any prompt or answer of the demo task — and the
forced-interruption phrase — round-trips exactly. `</think>` is an added (non-special) token so the
generator can stop on it and decoded text still contains it.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING

# Imported where a tokenizer is built: `THINK_END` and the token lists are read by modules that
# must stay light (a cached built-in's resolution imports this one).
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
THINK_END = "</think>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
CHARACTERS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The demo tokenizer: specials, then one token per printable character, then `</think>`."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    # BPE with no merges splits text into single characters; Fuse joins them back without spaces.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )
    fast.add_tokens([THINK_END])
    return fast


def save_tokenizer(path: Path) -> PreTrainedTokenizerFast:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(str(path))
    return tokenizer
