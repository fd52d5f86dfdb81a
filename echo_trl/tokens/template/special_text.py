"""Special-token text inside a conversation (a tool output holding ``<|im_end|>``) stays text.

To tell the template's own special tokens from the same text inside messages, the conversation is
rendered a second time with that text neutralized: each special token's text replaced by as many
neutral characters, so positions do not move (:func:`template_specials`).
"""

from __future__ import annotations

import numpy as np

from ...errors import TemplateError
from .info import NEUTRAL, TemplateInfo, render


def neutralized(value, specials: tuple[str, ...]):
    """``value`` (strings, lists, dicts) with each special token's text replaced by as many neutral characters."""
    if isinstance(value, str):
        for s in specials:
            value = value.replace(s, NEUTRAL * len(s))
        return value
    if isinstance(value, dict):
        return {k: neutralized(v, specials) for k, v in value.items()}
    if isinstance(value, list):
        return [neutralized(v, specials) for v in value]
    return value


def template_specials(
    tokenizer, info: TemplateInfo, messages: list[dict], tools, text: str
) -> tuple[list[tuple[int, int]], str]:
    """Where the template itself put special tokens in ``text``, found in a render of the same conversation
    whose special-token text is neutralized (same length; a template inserts it verbatim or JSON-escaped,
    and JSON escapes neither)."""
    neutral = render(tokenizer, neutralized(messages, info.special_tokens), neutralized(tools, info.special_tokens))
    if len(neutral) != len(text):
        raise TemplateError(
            "chat template renders special-token text inside the conversation in a "
            "length-changing way; cannot tell it from the template's own special tokens"
        )
    spans, taken = [], np.zeros(len(neutral) + 1, dtype=bool)
    for s in info.special_tokens:  # longest first
        at = neutral.find(s)
        while at != -1:
            if not taken[at : at + len(s)].any():
                spans.append((at, at + len(s)))
                taken[at : at + len(s)] = True
            at = neutral.find(s, at + len(s))
    return sorted(spans), neutral
