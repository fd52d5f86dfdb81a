"""A collection's output directory: each finished episode appended to its task's file; what is already there.

The file layer is :class:`~echo_trl.io.jsonl_store.JsonlStore` (one writer, each record one whole
fsynced line, a torn last line cut on the next run, the settings of the first run kept in
``capture_state.json``). Here is what the records mean: an episode goes to
``<scenario>_task<K>.jsonl``, and every record names its job (``metadata.episode.key``), so a rerun
with the same output skips the jobs already there and no episode is ever written twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ....data.readers.episode_files import iter_episode_records
from ....io.jsonl_store import JsonlStore, StoreError

EPISODE_GLOB = "*_task*.jsonl"
STATE_FILE = "capture_state.json"
LOCK_FILE = ".capture.lock"


def record_key(record: Any) -> str | None:
    """The job key a collected record carries (``None`` for a record written by something else)."""
    if not isinstance(record, dict):
        return None
    episode = (record.get("metadata") or {}).get("episode")
    return episode.get("key") if isinstance(episode, dict) and isinstance(episode.get("key"), str) else None


class CollectError(StoreError):
    """The output cannot be collected into (other settings, another writer, unreadable lines)."""


class EpisodeStore(JsonlStore):
    """The output directory of a collection (see the module docstring)."""

    error = CollectError

    def __init__(self, out: Path):
        super().__init__(out, pattern=EPISODE_GLOB, lock_file=LOCK_FILE, state_file=STATE_FILE, writer="capture")

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record of the output's episode files (a line that does not read is an error: lines are whole)."""
        paths = self.paths()
        if not paths:
            return
        for rec in iter_episode_records(paths):
            if rec.error is not None:
                raise CollectError(f"{rec.error} (move the file away to collect again)")
            yield rec.data

    def done_keys(self) -> set[str]:
        return {k for k in map(record_key, self.records()) if k is not None}

    def add(self, record: dict[str, Any]) -> None:
        """Append a finished episode to ``<scenario>_task<K>.jsonl`` as one write of one whole line, then fsync."""
        self.append(f"{record['scenario']}_task{record['task_idx']}.jsonl", record)
