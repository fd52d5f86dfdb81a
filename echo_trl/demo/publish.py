"""The demo's model caches (tiny base model, warmed model): directories that appear whole or not at all.

Two demos started at once build the same cache entry. Each writes a temporary sibling directory and renames
it into place in one step, so a reader finds either nothing or a finished directory, never another process's
half-written weights; the first finished writer wins and the other's copy is discarded. A directory is
finished when its marker file (written last, inside the temporary directory) reads as a JSON object.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import EchoTrlError
from ..io.atomic import move_dir_into_place, staging_dir
from ..io.outputs import disk_full_error, is_disk_full

__all__ = ["finished_record", "publish_dir"]


def finished_record(path: Path, marker: str) -> dict[str, Any] | None:
    """The marker's record of a finished directory at ``path``, or ``None`` (absent, or left half-written by a
    version that wrote in place: marker missing or unreadable)."""
    try:
        record = json.loads((path / marker).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def publish_dir(path: Path, marker: str, write: Callable[[Path], None], *, needs: int) -> None:
    """``write`` (which must write ``marker`` last) into a temporary sibling of ``path``, then rename it to
    ``path``; the temporary directory is removed whatever happens. A finished ``path`` written meanwhile by
    another process wins; an unfinished one is replaced. A full disk (``needs``: about the bytes written) is
    one line naming ``path``."""
    written = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with staging_dir(path) as tmp:  # removed whatever happens
            write(tmp)
            written = True
            if not move_dir_into_place(tmp, path, lambda p: finished_record(p, marker) is not None):
                raise EchoTrlError(f"{path}: cannot put the model there (another process keeps replacing it)")
    except Exception as exc:
        if written:
            raise
        if is_disk_full(exc) or (path.parent.is_dir() and shutil.disk_usage(path.parent).free < needs):
            raise disk_full_error(path, needs) from None
        raise
