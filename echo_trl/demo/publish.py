"""The demo's model caches (tiny base model, warmed model): directories that appear whole or not at all.

Two demos started at once build the same cache entry. Each writes a temporary sibling directory and renames
it into place in one step, so a reader finds either nothing or a finished directory, never another process's
half-written weights; the first finished writer wins and the other's copy is discarded. A directory is
finished when its marker file (written last, inside the temporary directory) reads as a JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import EchoTrlError
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
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
        write(tmp)
    except Exception as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc) or (path.parent.is_dir() and shutil.disk_usage(path.parent).free < needs):
            raise disk_full_error(path, needs) from None
        raise
    try:
        for _ in range(2):
            try:
                os.rename(tmp, path)
                return
            except OSError:  # path exists (a non-empty directory cannot be renamed over)
                if finished_record(path, marker) is not None:
                    return
                shutil.rmtree(path, ignore_errors=True)  # unfinished: replace it
        raise EchoTrlError(f"{path}: cannot put the model there (another process keeps replacing it)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
