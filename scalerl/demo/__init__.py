"""The built-in demo: a character-level tokenizer, a tiny Llama built locally and a synthetic task.

Nothing here downloads anything; `make demo` and the tests build what they need on first use.
"""
