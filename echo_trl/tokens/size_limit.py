"""A bound on the rendered text of one trajectory, so memory follows the input and not a tokenizer blow-up.

Why: a fast tokenizer holds several machine words per token (ids, offsets, token strings) for the whole
text at once, and the role layout renders a conversation a few times. One 50 MB tool output or a
100,000-step episode then needs many gigabytes and ends in an allocation abort with no message. No model
trains on such a row whole anyway (it is far beyond any context window), so a row whose rendered text
is longer than the bound is refused in one line that names it, its size, the limit and the flag that
raises it. The content length (every message, tool call and schema, a lower bound of the rendered
size) is checked before rendering, the rendered length before tokenizing.

The bound is a per-tokenizer setting (:func:`set_max_rendered_chars`): the trainer sets it from
``EchoGRPOConfig.max_rendered_chars`` and ``echo-trl stats`` from its flag, and every tokenization of
rows with that tokenizer, cached or not, obeys it.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import EchoTrlError
from ..roles import Trajectory

__all__ = [
    "DEFAULT_MAX_RENDERED_CHARS",
    "LIMIT_FLAG",
    "RenderedSizeError",
    "check_content_size",
    "check_rendered_size",
    "content_chars",
    "max_rendered_chars",
    "set_max_rendered_chars",
]

#: About 500k tokens: several times the longest context window a trajectory is trained at, and a peak
#: tokenizer memory of a few hundred MB.
DEFAULT_MAX_RENDERED_CHARS = 2_000_000
#: The flag (and ``EchoGRPOConfig`` field) that raises the bound.
LIMIT_FLAG = "--max_rendered_chars"

_LIMITS: dict[int, tuple[Any, int | None]] = {}


class RenderedSizeError(EchoTrlError):
    """A trajectory whose rendered text is longer than the configured bound."""


def set_max_rendered_chars(tokenizer, limit: int | None) -> None:
    """Bound every trajectory rendered with ``tokenizer`` to ``limit`` characters (``None``: no bound)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise EchoTrlError(f"{LIMIT_FLAG} must be a positive number of characters, got {limit!r}")
    _LIMITS[id(tokenizer)] = (tokenizer, limit)


def max_rendered_chars(tokenizer) -> int | None:
    """The bound set for ``tokenizer`` (:data:`DEFAULT_MAX_RENDERED_CHARS` unless set)."""
    entry = _LIMITS.get(id(tokenizer))
    return entry[1] if entry is not None and entry[0] is tokenizer else DEFAULT_MAX_RENDERED_CHARS


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if value is None:
        return 0
    return len(json.dumps(value, ensure_ascii=False, default=str))


def content_chars(trajectory: Trajectory) -> int:
    """Characters of every message's content and tool calls, warnings and tool schemas: all of them appear in
    the rendered text, so this is a lower bound of its length, known before rendering."""
    total = sum(_text_chars(t) for t in trajectory.tools)
    total += sum(len(w) for ws in trajectory.warnings for w in ws)
    for message in trajectory.messages:
        total += _text_chars(message.get("content"))
        for call in message.get("tool_calls") or ():
            function = call.get("function", call)
            total += _text_chars(function.get("name")) + _text_chars(function.get("arguments"))
    return total


def _refuse(size: str, limit: int) -> RenderedSizeError:
    return RenderedSizeError(
        f"rendered text is {size} characters, over the limit of {limit:,} "
        f"(raise it with {LIMIT_FLAG} N; the tokenizer needs memory in proportion)"
    )


def check_content_size(tokenizer, trajectory: Trajectory) -> None:
    """Refuse before rendering when the content alone is over the bound."""
    limit = max_rendered_chars(tokenizer)
    if limit is not None and (n := content_chars(trajectory)) > limit:
        raise _refuse(f"at least {n:,}", limit)


def check_rendered_size(tokenizer, text: str) -> None:
    """Refuse a rendered conversation over the bound before it is tokenized."""
    limit = max_rendered_chars(tokenizer)
    if limit is not None and len(text) > limit:
        raise _refuse(f"{len(text):,}", limit)
