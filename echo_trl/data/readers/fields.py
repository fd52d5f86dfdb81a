"""Field checks every record reader uses, so every format fails with the same wording.

Each check takes the value and its field path (``steps[3].action.tool_name``) and raises
:class:`~echo_trl.errors.EpisodeError` naming that path; the reader that knows the file and
record adds them (:meth:`EpisodeError.at`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ...errors import EpisodeError

#: The range of the dataset's ``int64`` columns.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def type_name(value: Any) -> str:
    """How an error names a JSON value's type (``null``, ``an object``, ``a list`` ...)."""
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


def expect(value: Any, kinds: type | tuple[type, ...], field: str, what: str) -> Any:
    """``value`` when it is one of ``kinds`` (a boolean is no number unless ``bool`` is listed)."""
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise EpisodeError(f"expected {what}, got {type_name(value)}", field=field)
    if not isinstance(value, kinds):
        raise EpisodeError(f"expected {what}, got {type_name(value)}", field=field)
    return value


def finite(value: Any, field: str) -> float:
    """A finite number as a float (an integer too large for a float is an error, not ``inf``)."""
    expect(value, (int, float), field, "a number")
    try:
        number = float(value)  # an integer like 10**400 has no float: OverflowError
    except OverflowError:
        raise EpisodeError("number out of range (an integer too large for a float)", field=field) from None
    if not math.isfinite(number):
        raise EpisodeError(f"expected a finite number, got {value}", field=field)
    return number


def int64(value: Any, field: str) -> int:
    """An integer the dataset's ``int64`` column can hold (Arrow raises OverflowError otherwise)."""
    expect(value, int, field, "an integer")
    if not INT64_MIN <= value <= INT64_MAX:
        raise EpisodeError("integer out of range (the dataset stores a 64-bit integer)", field=field)
    return value


def child(field: str, key: Any) -> str:
    """The path of ``key`` under ``field``: ``a[3]`` for a list index, ``a.b`` for an object key."""
    if isinstance(key, int):
        return f"{field}[{key}]"
    return f"{field}.{key}" if field else str(key)


def required(obj: dict[str, Any], key: str, field: str) -> Any:
    """``obj[key]``, or an error naming the missing field."""
    if key not in obj:
        raise EpisodeError("missing", field=child(field, key))
    return obj[key]


def check_text(value: Any, field: str = "") -> None:
    """Raise :class:`EpisodeError` at the first string (key or value) that is not valid Unicode.

    JSON escapes can spell lone surrogates (``"\\ud800"``); Python keeps them, but no UTF-8
    writer (Arrow, a file, a tokenizer) can, so one would fail the whole build far from its
    record. Iterative, so depth is no problem.
    """
    try:  # fast path, in C: only a record that fails it is walked to name the field
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return
    except (UnicodeEncodeError, RecursionError, TypeError, ValueError):
        pass
    stack = [(value, field)]
    while stack:
        item, here = stack.pop()
        if isinstance(item, str):
            check_utf8(item, here)
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str):
                    check_utf8(key, f"{here} (a key)" if here else "(a key)")
                stack.append((sub, child(here, key)))
        elif isinstance(item, list):
            stack.extend((sub, child(here, i)) for i, sub in enumerate(item))


def check_utf8(text: str, field: str) -> None:
    """Raise :class:`EpisodeError` when ``text`` holds a lone surrogate (no UTF-8 writer can store it)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise EpisodeError(
            f"lone surrogate {ascii(bad)} at character {exc.start} is not valid Unicode text", field=field or None
        ) from None


#: The lowest behaviour log-prob accepted (refused below, never clipped). ``exp(-50)`` is about 2e-22: a token that
#: unlikely is never sampled (even 10^12 tokens from a 10^6-token vocabulary reach it with a chance below 10^-3), so
#: a lower value is no sample's log-prob: vLLM's OpenAI server writes ``max(logprob, -9999.0)``, i.e. -9999.0 for a
#: token its sampler gave probability 0 (``-inf``), and a hostile or buggy server anything. The floor also keeps
#: TRL's importance ratio ``exp(logp - behaviour_logp)`` at most ``exp(50 + tolerance)`` (~5e21, 16 orders of
#: magnitude below float32's maximum): its ``exp`` and gradient cannot overflow.
BEHAVIOR_LOGPROB_FLOOR = -50.0
#: How far above 0 a behaviour log-prob may be: float32 rounding of a ``log_softmax`` near 0 is ~1e-7 and a
#: half-precision one's below 1e-3; a value beyond that is no log-probability (+50 would clip every token).
BEHAVIOR_LOGPROB_TOLERANCE = 1e-3
#: What the errors say about the accepted range (one place, so every reader says the same).
BEHAVIOR_LOGPROB_RANGE = (
    f"a behaviour log-prob must be finite, <= 0 (up to {BEHAVIOR_LOGPROB_TOLERANCE:g}) and >= "
    f"{BEHAVIOR_LOGPROB_FLOOR:g} (vLLM writes -9999.0 for a token it gave probability 0): re-record the episode, "
    "or leave its behavior_logprobs null (the starting model's log-probs stand in)"
)


def logprob_problem(value: float) -> str | None:
    """Why ``value`` cannot be a sampled token's behaviour log-prob (``None`` when it can): NaN, infinite, above
    0 beyond :data:`BEHAVIOR_LOGPROB_TOLERANCE` or below :data:`BEHAVIOR_LOGPROB_FLOOR`."""
    if math.isnan(value):
        return "NaN is not a log-prob"
    if value > BEHAVIOR_LOGPROB_TOLERANCE:
        return f"{value:g} is above 0 (a log-prob is <= 0)"
    if value < BEHAVIOR_LOGPROB_FLOOR:
        return f"{value:g} is below the floor {BEHAVIOR_LOGPROB_FLOOR:g}"
    return None


def behavior_logprobs(value: Any, field: str = "behavior_logprobs") -> list[float] | None:
    """A record's per-action-token log-probabilities: ``None`` (not recorded) or a list of numbers each a possible
    sampled token's log-prob (:func:`logprob_problem`)."""
    if value is None:
        return None
    expect(value, list, field, "a list of numbers")
    values = [finite(v, child(field, i)) for i, v in enumerate(value)]
    for i, v in enumerate(values):
        problem = logprob_problem(v)
        if problem is not None:
            raise EpisodeError(f"{problem}; {BEHAVIOR_LOGPROB_RANGE}", field=child(field, i))
    return values
