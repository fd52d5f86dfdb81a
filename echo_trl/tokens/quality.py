"""Rollout quality: the statistics the world-term filters (``wm_filter_min_*``) look at.

A rollout whose tool calls were mostly invalid, unparsable or failing teaches the world model
what the environment says to nonsense; the filters keep such rollouts' env tokens out of the
world term (the policy term still trains on them). Pure: messages in, percentages out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

#: Rollout-quality statistics (percentages, 0-100) the world-term filters read. A dataset may carry
#: columns of these names to override the values derived from the messages.
QUALITY_KEYS = ("valid_tool_call_pct", "parse_clean_pct", "correct_pct")

#: Harness actions that are valid calls though no tool schema lists them (AWM's ``verify``).
HARNESS_ACTIONS = frozenset({"verify"})


def is_error_output(text: Any) -> bool:
    """Whether a tool message reports a failure: ``Error...`` text, or an object with a truthy ``error``.

    Covers AWM errors (``error`` observations become ``Error: ...`` text or JSON with an ``error``
    field) and TRL's tool loop, which records a failed call as ``str({"error": "..."})``.
    """
    if not isinstance(text, str):
        return False
    s = text.strip()
    if s.lower().startswith("error"):
        return True
    if s.startswith("{'error'"):
        return True
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            return False
        return isinstance(obj, dict) and bool(obj.get("error"))
    return False


def rollout_quality(
    messages: Sequence[dict[str, Any]], tools: Sequence[Any] = (), warnings: Sequence[Sequence[str]] | None = None
) -> dict[str, float]:
    """Percentages (0-100) of valid tool calls, cleanly parsed turns and non-error tool results.

    * ``valid_tool_call_pct``: assistant turns with a tool call whose every name is among ``tools``
      or :data:`HARNESS_ACTIONS` (any name counts when the tool list is unknown);
    * ``parse_clean_pct``: assistant turns that parsed into a tool call and whose tool results
      carried no harness warning;
    * ``correct_pct``: tool results that are not errors (:func:`is_error_output`).

    A trajectory with no assistant turn (or no tool result) scores 100 on that statistic.
    """
    names = {_tool_name(t) for t in tools} - {None}
    names = names | HARNESS_ACTIONS if names else names
    warnings = list(warnings) if warnings is not None else [[] for _ in messages]
    turns = valid = clean = results = ok = 0
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            turns += 1
            calls = m.get("tool_calls") or []
            called = [c.get("function", {}).get("name") for c in calls]
            if calls and (not names or all(n in names for n in called)):
                valid += 1
            answers = []
            j = i + 1
            while j < len(messages) and messages[j].get("role") == "tool":
                answers.append(j)
                j += 1
            if calls and not any(warnings[j] for j in answers if j < len(warnings)):
                clean += 1
        elif m.get("role") == "tool":
            results += 1
            ok += not is_error_output(m.get("content"))
    pct = lambda a, b: 100.0 * a / b if b else 100.0  # noqa: E731
    return {
        "valid_tool_call_pct": pct(valid, turns),
        "parse_clean_pct": pct(clean, turns),
        "correct_pct": pct(ok, results),
    }


def with_dataset_columns(quality: dict[str, float], row: dict[str, Any]) -> dict[str, float]:
    """``quality`` with the values a dataset row carries in columns of :data:`QUALITY_KEYS` (not null) instead."""
    return quality | {key: float(row[key]) for key in QUALITY_KEYS if row.get(key) is not None}


def _tool_name(tool: Any) -> str | None:
    if isinstance(tool, str):
        try:
            tool = json.loads(tool)
        except ValueError:
            return tool
    if isinstance(tool, dict):
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        return fn.get("name")
    return getattr(tool, "__name__", None)


def passes_filters(quality: dict[str, float], settings) -> bool:
    """Whether a rollout's env tokens may train the world model (the filters gate only the world term).

    ``settings`` has ``min_valid_tool_call_pct``, ``min_parse_clean_pct`` and ``min_correct_pct``
    (:class:`echo_trl.train.offline.collator.CollatorSettings`).
    """
    return (
        quality["valid_tool_call_pct"] >= settings.min_valid_tool_call_pct
        and quality["parse_clean_pct"] >= settings.min_parse_clean_pct
        and quality["correct_pct"] >= settings.min_correct_pct
    )
