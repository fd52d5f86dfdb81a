"""JSON exactly as the standard has it, for text from outside (an inference server, a model's tool call).

Why: Python's ``json`` reads ``NaN``/``Infinity`` and turns ``1e400`` into ``inf``; what it writes with them is
not JSON (the library's own readers refuse it), so one such number from a server made a whole task file
unreadable. It also raises ``RecursionError`` (not ``ValueError``) on deeply nested input, and writes lone
surrogates that cannot be encoded. :func:`loads` refuses all of these as one :class:`StrictJSONError`
(a ``ValueError``); :func:`dumps` writes only strict JSON in UTF-8 or raises it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["StrictJSONError", "dumps", "loads", "non_finite_path", "scrub"]


class StrictJSONError(ValueError):
    """The text is not strict JSON (or a value cannot be written as strict JSON); the message says why."""


def _no_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError(f"the number {text[:40]}{'...' if len(text) > 40 else ''} overflows a float")
    return value


def loads(text: str | bytes) -> Any:
    """``json.loads`` refusing NaN, Infinity, numbers that overflow a float and nesting Python cannot recurse."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise StrictJSONError("nested too deeply to read") from None
    except StrictJSONError:
        raise
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError, int with > 4300 digits
        raise StrictJSONError(" ".join(str(exc).split())[:200]) from None


def dumps(value: Any) -> bytes:
    """``value`` as one line of strict JSON in UTF-8 (non-ASCII kept): no NaN/Infinity, no lone surrogate."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except RecursionError:
        raise StrictJSONError("nested too deeply to write") from None
    except UnicodeEncodeError as exc:
        raise StrictJSONError(f"a lone surrogate {ascii(exc.object[exc.start : exc.end])} is not UTF-8") from None
    except ValueError as exc:
        where = non_finite_path(value)
        raise StrictJSONError(f"{exc}{f' at {where}' if where else ''}") from None


def non_finite_path(value: Any, path: str = "") -> str | None:
    """Where the first NaN/infinite float of ``value`` is (``a.b[3]``), ``None`` when there is none."""
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where or "(top)"
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in reversed(list(item.items())))
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(value: Any) -> tuple[Any, bool]:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD, and whether any was:
    JSON escapes such as ``"\\ud800"`` decode to them, and UTF-8 cannot write them."""
    changed = False

    def clean(item: Any) -> Any:
        nonlocal changed
        if isinstance(item, str):
            if _SURROGATE.search(item):
                changed = True
                return _SURROGATE.sub("\ufffd", item)
            return item
        if isinstance(item, dict):
            return {clean(k): clean(v) for k, v in item.items()}
        if isinstance(item, list):
            return [clean(v) for v in item]
        return item

    try:
        return clean(value), changed
    except RecursionError:
        raise StrictJSONError("nested too deeply to read") from None
