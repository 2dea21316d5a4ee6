"""Tokenizers with tool-aware chat templates, built locally, for the agents tests.

Two templates a user's model may have: `KEEPS_PREFIX` renders every past turn as it was written
(the conversation only grows), `DROPS_THINKING` leaves out the thinking of past assistant turns
(as Qwen3's does), so a conversation in which the model thought cannot keep its prefix.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerFast

from scalerl.demo import bpe

_TURNS = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\\n' }}"
    "{% if m['role'] == 'system' and tools %}{{ m['content'] + '\\nTools: ' }}"
    "{% for t in tools %}{{ t['function']['name'] }}{% if not loop.last %}, {% endif %}"
    "{% endfor %}"
    "{% elif m['role'] == 'assistant' %}{{ ASSISTANT }}"
    "{% for c in m.get('tool_calls') or [] %}"
    "{{ '<tool_call>{\"name\": \"' + c['function']['name'] + '\", \"arguments\": ' "
    "+ c['function']['arguments'] + '}</tool_call>' }}"
    "{% endfor %}"
    "{% else %}{{ m['content'] }}{% endif %}"
    "{{ '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
KEEPS_PREFIX = _TURNS.replace("ASSISTANT", "m['content'] or ''")
# Past assistant turns lose what came before `</think>` (the last turn keeps it).
DROPS_THINKING = _TURNS.replace(
    "ASSISTANT",
    "(m['content'] or '').split('</think>')[-1] if not loop.last else (m['content'] or '')",
)

TEXTS = [
    "What is 12*34? 408 The answer is 408. Guess the number higher lower correct",
    '{"name": "calculate", "arguments": {"expression": "12*34"}}',
    "You can use a calculator. <think> hmm </think> 0123456789 +-*/()",
]


def chat_tokenizer(template: str = KEEPS_PREFIX) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with roles system/user/assistant/tool, `<|end|>` ending every
    turn, and `<tool_call>` / `</tool_call>` as whole tokens."""
    tokenizer = bpe.build_tokenizer(TEXTS, merges=48)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    tokenizer.add_tokens(["<tool_call>", "</tool_call>", "<think>", "</think>"])
    tokenizer.chat_template = template
    return tokenizer


def end_id(tokenizer: Any) -> int:
    return int(tokenizer.convert_tokens_to_ids(bpe.END))
