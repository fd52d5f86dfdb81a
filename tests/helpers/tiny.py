"""Tiny local tokenizers and models (no downloads), one per chat-template family.

conftest imports this module before it sets ``HF_HUB_OFFLINE``: echo_trl (and with it huggingface_hub, which
reads the environment once on import) loads only when a builder is first called."""

from __future__ import annotations

import functools

TEMPLATE_FAMILIES = ("qwen2_5", "qwen3", "llama3_1")


@functools.cache
def _built_tokenizer(family: str):
    from echo_trl.demo.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(family)


def tiny_tokenizer(family: str = "qwen3"):
    """A copy of the family's tokenizer, built once: libraries change the tokenizer they are given (TRL sets a
    response schema on it when it gets tools), and no test may see what an earlier one did (~4 ms a copy)."""
    import copy

    return copy.deepcopy(_built_tokenizer(family))


def tiny_model(seed: int = 0):
    from echo_trl.demo.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer("qwen3"), "qwen3", hidden_size=32, num_layers=2, num_heads=4, seed=seed)
