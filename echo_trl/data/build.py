"""Build the trajectory dataset: recorded episodes or trajectories -> ``datasets.Dataset`` of :data:`FEATURES`.

Every row is encoded on its own (:func:`echo_trl.data.schema.encode_row`) inside its record's error
handling, so a value the schema cannot store names its record and column, and a lenient build
skips that record instead of failing on the whole input.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import datasets
import pyarrow as pa

from ..errors import EpisodeError
from ..roles import Trajectory
from .formats import FORMATS
from .prompt import DEFAULT_SYSTEM_PROMPT
from .records import SkippedRecord, load_awm_episodes
from .schema import ARROW_SCHEMA, FEATURES, encode_row

__all__ = ["build_awm_dataset", "trajectories_to_dataset"]


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
    and every valid record is kept. ``compact_tools`` drops the response documentation fastapi-mcp
    appends to tool descriptions (much shorter prompts; :func:`echo_trl.data.tools.compact_tool_schema`).

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
