"""The tiny local tokenizers and models, at their documented import path (``docs/training.md``, tests,
benchmarks); they live in the demo package, :mod:`echo_trl.demo.tiny`."""

from .demo.tiny import (  # noqa: F401
    FAMILIES,
    PRETOKENIZE_PATTERN,
    TemplateFamily,
    build_tiny_model,
    build_tiny_tokenizer,
    corpus_of,
    ensure_tiny_model,
    trl_chat_template,
)
