"""A byte-level BPE tokenizer with a chat template, trained with `tokenizers` on a task's text.

The second built-in's tokenizer, made to differ from the demo's character tokenizer in every way
the engine could silently depend on:

- byte-level BPE (merges learned from the task's text), so any Unicode text round-trips and one
  token may span several characters; digits are split one per token, as many real tokenizers
  do, so a number's digits are separate tokens the model can compute on;
- special tokens at the end of the vocabulary (the pad id is not 0), no BOS at all;
- the tokenizer's EOS is `<|endoftext|>`, but an assistant turn ends with `<|end|>`: only the
  generation config lists both (as Llama 3 instruct models do), so an engine that reads EOS from
  the tokenizer alone never stops;
- a Jinja chat template with system, user and assistant turns, saved in `tokenizer_config.json`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

# Imported where a tokenizer is built: the token names and the template are read by modules that
# must stay light (a cached built-in's resolution imports this one).
if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

END_OF_TEXT = "<|endoftext|>"  # the tokenizer's EOS: ends a document
END = "<|end|>"  # ends every chat turn; the assistant's completion stops here
PAD = "<|pad|>"
ROLES = ("system", "user", "assistant")
ROLE_TOKENS = [f"<|{role}|>" for role in ROLES]
SPECIAL_TOKENS = [PAD, END_OF_TEXT, END, *ROLE_TOKENS]

# Each turn is `<|role|>\ncontent<|end|>\n`; the generation prompt opens the assistant's turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown chat role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
GENERATION_PROMPT = "<|assistant|>\n"


def _core(texts: Iterable[str], merges_budget: int) -> Tokenizer:
    """BPE merges learned from `texts` over the 256 byte symbols (no special tokens yet)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + merges_budget,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    return core


def build_tokenizer(texts: Iterable[str], merges: int = 64) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with at most `merges` merges learned from `texts`.

    Special tokens are added after training, so they take the last ids and never take part in
    merges; the chat template writes them as text and they are matched whole when encoded.
    """
    from transformers import PreTrainedTokenizerFast

    core = _core(texts, merges)
    fast = PreTrainedTokenizerFast(tokenizer_object=core)
    fast.add_special_tokens(
        {
            "eos_token": END_OF_TEXT,
            "pad_token": PAD,
            "additional_special_tokens": [END, *ROLE_TOKENS],
        }
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def end_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Every id that ends an assistant completion: the turn end first, then the tokenizer's EOS."""
    end = tokenizer.convert_tokens_to_ids(END)  # one token in, one id out
    assert isinstance(end, int), end
    return [end, int(tokenizer.eos_token_id)]


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """Save in Hugging Face format with the chat template inside `tokenizer_config.json` (not a
    separate `chat_template.jinja`), the form most published models still have."""
    tokenizer.save_pretrained(str(path), save_jinja_files=False)
