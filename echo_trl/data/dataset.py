"""Trajectories as a typed Hugging Face ``datasets.Dataset`` (TRL's conversational format).

One row is one trajectory. ``prompt`` / ``completion`` are lists of chat messages, so TRL
utilities and ``apply_chat_template`` work on the rows. Arrow needs one type per column, so
two JSON-shaped values are stored as JSON text: a tool call's ``arguments`` and each entry of
``tools``. :func:`row_to_trajectory` turns them back into objects before rendering.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
from datasets import Features, List, Value

from ..errors import DatasetSchemaError, EpisodeError
from ..outputs import atomic_output_dir
from ..roles import Trajectory
from .awm import DEFAULT_SYSTEM_PROMPT, FORMATS, SkippedRecord, load_awm_episodes
from .card import dataset_card

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

REQUIRED_COLUMNS = ("prompt", "completion", "tools", "warnings", "reward", "group_id", "scenario", "task_idx")


# --------------------------------------------------------------------------------------------
# Row <-> Trajectory


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


CHAT_ROLES = ("system", "user", "assistant", "tool")


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
    ``awm-agent``, see :data:`echo_trl.data.awm.FORMATS`), so that later steps know how it was built.
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
    return Trajectory(
        prompt=[_message_from_row(m, f"prompt[{i}]") for i, m in enumerate(row["prompt"])],
        completion=completion,
        tools=[]
        if row.get("format") == "awm-agent"
        else [_json_object(t, f"tools[{i}]") for i, t in enumerate(row.get("tools") or [])],
        warnings=[list(w) for w in row.get("warnings") or [[] for _ in completion]],
        reward=float(row.get("reward") or 0.0),
        scenario=row.get("scenario") or "",
        task_idx=int(row["task_idx"]) if row.get("task_idx") is not None else -1,
        group_id=row.get("group_id") or "",
        behavior_logprobs=row.get("behavior_logprobs"),
    )


ARROW_SCHEMA = FEATURES.arrow_schema


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


def _dataset_from_batches(batches: list[pa.RecordBatch]) -> datasets.Dataset:
    table = pa.Table.from_batches(batches, schema=ARROW_SCHEMA).combine_chunks()
    return datasets.Dataset(table, info=datasets.DatasetInfo(features=FEATURES))


def trajectories_to_dataset(trajectories: Iterable[Trajectory], format: str = "chat-template") -> datasets.Dataset:
    """A dataset with the explicit ECHO schema (never inferred, so every build has one schema).

    Raises :class:`EpisodeError` naming the row (``row N``) and column a value cannot be stored in.
    """
    batches = []
    for i, trajectory in enumerate(trajectories):
        try:
            batches.append(encode_row(trajectory, format))
        except EpisodeError as exc:
            raise exc.at(source="trajectories", record=f"row {i}") from None
    return _dataset_from_batches(batches)


def build_awm_dataset(
    inputs: Iterable[str | Path],
    *,
    strict: bool = True,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    skipped: list[SkippedRecord] | None = None,
    show_progress: bool | None = None,
    compact_tools: bool = False,
    format: str = "chat-template",
    verify_turn: str | None = None,
) -> datasets.Dataset:
    """Build the trajectory dataset from AWM episode files and directories.

    Deterministic: inputs are read in sorted order and rows keep that order. With
    ``strict=False`` invalid records are appended to ``skipped`` (when given) instead of raising,
    and every valid record is kept. ``compact_tools`` drops the response documentation
    fastapi-mcp appends to tool descriptions (much shorter prompts; see ``compact_tool_schema``).

    ``format``: ``chat-template`` (tool calls and schemas for the model's chat template) or
    ``awm-agent`` (the official AWM agent's conversation: its system prompt, ``list_tools`` /
    ``call_tool``; see ``docs/datasets.md``); recorded in the ``format`` column.
    ``verify_turn``: ``env_output`` or ``omit`` the verifier step (default: ``env_output`` for
    chat-template, ``omit`` for awm-agent). Conversation logs (``messages`` + ``reward``) are
    taken as recorded in either format.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})")
    batches: list[pa.RecordBatch] = []  # encoded inside each record's error handling (see encode_row)
    _, rejected = load_awm_episodes(
        inputs,
        strict=strict,
        system_prompt=system_prompt,
        compact_tools=compact_tools,
        show_progress=show_progress,
        format=format,
        verify_turn=verify_turn,
        check=lambda t: batches.append(encode_row(t, format)),
    )
    if skipped is not None:
        skipped.extend(rejected)
    return _dataset_from_batches(batches)


# --------------------------------------------------------------------------------------------
# Loading and checking


def validate_dataset(ds: datasets.Dataset, name: str = "dataset") -> datasets.Dataset:
    """Check the columns ECHO needs; cast compatible schemas (e.g. parquet from the Hub) to ours."""
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise DatasetSchemaError(
            f"{name}: missing column(s) {', '.join(missing)}; expected the ECHO trajectory schema "
            f"({', '.join(REQUIRED_COLUMNS)}). Build it with `echo-trl build-dataset`."
        )
    if "behavior_logprobs" not in ds.column_names:
        ds = ds.add_column("behavior_logprobs", [None] * len(ds), feature=FEATURES["behavior_logprobs"])
    if "format" not in ds.column_names:  # built before formats existed: chat-template
        ds = ds.add_column("format", ["chat-template"] * len(ds), feature=FEATURES["format"])
    extra = [c for c in ds.column_names if c not in FEATURES]
    if ds.features != FEATURES:
        wanted = Features({**{k: v for k, v in ds.features.items() if k in extra}, **FEATURES})
        try:
            ds = ds.cast(Features({c: wanted[c] for c in ds.column_names}))
        except (ValueError, TypeError) as exc:
            bad = [c for c in FEATURES if c in ds.features and ds.features[c] != FEATURES[c]]
            raise DatasetSchemaError(
                f"{name}: column(s) {', '.join(bad)} have the wrong feature type ({exc})"
            ) from None
    return ds


def load_echo_dataset(name_or_path: str | Path, split: str = "train") -> datasets.Dataset:
    """Load a trajectory dataset: a ``save_to_disk`` directory, local data files, or a Hub id."""
    path = Path(name_or_path)
    if path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists()):
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    else:
        ds = datasets.load_dataset(str(name_or_path), split=split)
    return validate_dataset(ds, str(name_or_path))


#: A file every ``save_to_disk`` directory has: what makes an existing ``--output`` replaceable.
DATASET_MARKER = "dataset_info.json"


def save_dataset(
    ds: datasets.Dataset,
    output_dir: str | Path,
    *,
    skipped: list[SkippedRecord] = (),
    push_to_hub: str | None = None,
    private: bool | None = None,
) -> Path:
    """``save_to_disk`` plus the dataset card and the skipped-records report; optionally push.

    Atomic: everything is written into a temporary sibling directory that then replaces
    ``output_dir`` in one rename, under a lock (:mod:`echo_trl.outputs`), so a killed or failed save
    leaves the previous dataset intact and a concurrent writer is refused. An existing
    ``output_dir`` must be empty or a previous dataset.
    """
    out = Path(output_dir)
    with atomic_output_dir(out, replace_if=DATASET_MARKER) as tmp:
        ds.save_to_disk(str(tmp))
        card = dataset_card(ds, skipped=len(skipped))
        (tmp / "README.md").write_text(card, encoding="utf-8")
        if skipped:
            with (tmp / "skipped.jsonl").open("w", encoding="utf-8") as fh:
                for s in skipped:
                    fh.write(s.to_jsonl() + "\n")
    if push_to_hub:
        from huggingface_hub import DatasetCard

        ds.push_to_hub(push_to_hub, private=private)
        DatasetCard(card).push_to_hub(push_to_hub, repo_type="dataset")
    return out
