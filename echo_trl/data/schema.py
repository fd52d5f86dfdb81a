"""The dataset row: its schema (:data:`FEATURES`) and the codec between rows and trajectories.

One row is one trajectory, in TRL's conversational format: ``prompt`` / ``completion`` are lists
of chat messages, so TRL utilities and ``apply_chat_template`` work on the rows. Arrow needs one
type per column, so two JSON-shaped values are stored as JSON text: a tool call's ``arguments``
and each entry of ``tools``. :func:`row_to_trajectory` turns them back into objects before
rendering. Building datasets is :mod:`echo_trl.data.build`; loading and saving them
:mod:`echo_trl.data.store`.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from datasets import Features, List, Value

from ..errors import DatasetSchemaError, EpisodeError
from ..roles import CHAT_ROLES, Trajectory

TOOL_CALL_FEATURE = {
    "type": Value("string"),
    "function": {"name": Value("string"), "arguments": Value("string")},
    "id": Value("string"),  # the call's id when recorded (some templates render it; absent ones are generated)
}
MESSAGE_FEATURE = {
    "role": Value("string"),
    "content": Value("string"),
    "name": Value("string"),
    "tool_calls": List(TOOL_CALL_FEATURE),
    "tool_call_id": Value("string"),  # a tool message's call, when recorded
}

#: The ECHO trajectory schema (one row per episode).
FEATURES = Features(
    {
        "prompt": List(MESSAGE_FEATURE),
        "completion": List(MESSAGE_FEATURE),
        "tools": List(Value("string")),
        "warnings": List(List(Value("string"))),
        "reward": Value("float64"),
        "group_id": Value("string"),
        "scenario": Value("string"),
        "task_idx": Value("int64"),
        "behavior_logprobs": List(Value("float64")),
        "format": Value("string"),
    }
)

#: :data:`FEATURES` as Arrow types (what :func:`encode_row` writes).
ARROW_SCHEMA = FEATURES.arrow_schema

REQUIRED_COLUMNS = ("prompt", "completion", "tools", "warnings", "reward", "group_id", "scenario", "task_idx")


def _json_text(value: Any, field: str) -> str:
    """JSON text for an Arrow string column; a value json cannot write is the record's error."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)  # standard JSON any reader parses
    except RecursionError:
        raise EpisodeError("nested too deeply to store as JSON text", field=field) from None
    except (TypeError, ValueError) as exc:
        raise EpisodeError(f"cannot store as JSON text ({exc})", field=field) from None


def _message_to_row(message: dict[str, Any], field: str = "message") -> dict[str, Any]:
    calls = message.get("tool_calls")
    return {
        "role": message["role"],
        "content": message.get("content") if calls else message.get("content") or "",  # None kept with calls
        "name": message.get("name"),
        "tool_call_id": message.get("tool_call_id"),
        "tool_calls": None
        if not calls
        else [
            {
                "type": c.get("type", "function"),
                "function": {
                    "name": c["function"]["name"],
                    "arguments": _json_text(
                        c["function"].get("arguments") or {}, f"{field}.tool_calls[{j}].function.arguments"
                    ),
                },
                "id": c.get("id"),
            }
            for j, c in enumerate(calls)
        ],
    }


def _message_from_row(message: dict[str, Any], field: str = "message") -> dict[str, Any]:
    if message.get("role") not in CHAT_ROLES:
        raise DatasetSchemaError(
            f"{field}.role: unknown role {message.get('role')!r} (expected one of {', '.join(CHAT_ROLES)})"
        )
    if not isinstance(message.get("content") or "", str):
        raise DatasetSchemaError(f"{field}.content: expected a string")
    content = message.get("content")
    none_kept = content is None and message.get("tool_calls")  # a tool-call turn recorded without content
    out: dict[str, Any] = {"role": message["role"], "content": None if none_kept else content or ""}
    if message.get("name") is not None:
        out["name"] = message["name"]
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": c.get("type") or "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": _json_object(
                        c["function"]["arguments"], f"{field}.tool_calls[{j}].function.arguments"
                    ),
                },
                **({"id": c["id"]} if c.get("id") is not None else {}),
            }
            for j, c in enumerate(message["tool_calls"])
        ]
    return out


def _json_object(value: Any, field: str = "value") -> Any:
    if not isinstance(value, str):
        return value or {}
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise DatasetSchemaError(f"{field}: expected JSON text ({reason})") from None


def trajectory_to_row(trajectory: Trajectory, format: str = "chat-template") -> dict[str, Any]:
    """One dataset row (plain Python values matching :data:`FEATURES`).

    ``format`` names the conversation format the messages are in (``chat-template`` or
    ``awm-agent``, see :data:`echo_trl.data.readers.formats.FORMATS`), so that later steps know how it was built.
    """
    return {
        "prompt": [_message_to_row(m, f"prompt[{i}]") for i, m in enumerate(trajectory.prompt)],
        "completion": [_message_to_row(m, f"completion[{i}]") for i, m in enumerate(trajectory.completion)],
        "tools": [_json_text(t, f"tools[{i}]") for i, t in enumerate(trajectory.tools)],
        "warnings": [list(w) for w in trajectory.warnings],
        "reward": float(trajectory.reward),
        "group_id": trajectory.group_id,
        "scenario": trajectory.scenario,
        "task_idx": int(trajectory.task_idx),
        "behavior_logprobs": trajectory.behavior_logprobs,
        "format": format,
    }


def row_to_trajectory(row: dict[str, Any]) -> Trajectory:
    """Inverse of :func:`trajectory_to_row`: messages ready for ``apply_chat_template``.

    An ``awm-agent`` row renders without tool schemas (``tools`` empty), as the official agent
    asks its model: the system prompt itself describes ``list_tools`` and ``call_tool``; the
    row's ``tools`` column keeps their schemas for code that needs them (e.g. an environment).
    """
    missing = [c for c in ("prompt", "completion") if c not in row]
    if missing:
        raise DatasetSchemaError(f"row is missing column(s) {', '.join(missing)}")
    completion = [_message_from_row(m, f"completion[{i}]") for i, m in enumerate(row["completion"])]
    warnings = row.get("warnings") or []
    if warnings and len(warnings) != len(completion):
        raise DatasetSchemaError(
            f"warnings: {len(warnings)} entries for {len(completion)} completion messages "
            "(one list of warnings per completion message)"
        )
    return Trajectory(
        prompt=[_message_from_row(m, f"prompt[{i}]") for i, m in enumerate(row["prompt"])],
        completion=completion,
        tools=[]
        if row.get("format") == "awm-agent"
        else [_json_object(t, f"tools[{i}]") for i, t in enumerate(row.get("tools") or [])],
        warnings=[list(w) for w in warnings or [[] for _ in completion]],
        reward=float(row.get("reward") or 0.0),
        scenario=row.get("scenario") or "",
        task_idx=int(row["task_idx"]) if row.get("task_idx") is not None else -1,
        group_id=row.get("group_id") or "",  # none stored: the Trajectory's default group
        behavior_logprobs=row.get("behavior_logprobs"),
    )


def encode_row(trajectory: Trajectory, format: str = "chat-template") -> pa.RecordBatch:
    """One trajectory as a one-row Arrow batch of :data:`FEATURES`.

    Encoded one record at a time so a value Arrow cannot store (a lone surrogate, an integer
    beyond int64) is an :class:`EpisodeError` naming its column, and a lenient build skips
    that record instead of failing on the whole input.
    """
    row = trajectory_to_row(trajectory, format)
    try:
        return pa.RecordBatch.from_pylist([row], schema=ARROW_SCHEMA)
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as whole:
        failure, field = whole, None
        for name in FEATURES:  # name the column (the one-row batch does not say)
            try:
                pa.array([row[name]], type=ARROW_SCHEMA.field(name).type)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                failure, field = exc, name
                break
        raise EpisodeError(
            f"cannot be stored in the dataset ({type(failure).__name__}: {failure})", field=field
        ) from None
