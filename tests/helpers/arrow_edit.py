"""Edit a ``save_to_disk`` dataset's Arrow data in place, leaving ``state.json`` (its fingerprint) untouched."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa


def arrow_files(directory: str | Path) -> list[Path]:
    """The data files of a saved dataset."""
    return sorted(Path(directory).glob("data-*.arrow"))


def _replace(value, old: str, new: str):
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_replace(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, old, new) for k, v in value.items()}
    return value


def redact_in_place(directory: str | Path, old: str, new: str) -> int:
    """Replace ``old`` by ``new`` in every string of the saved dataset; returns how many files changed.

    Same UTF-8 length: the bytes are overwritten in the file itself and its mtime set back, so size, inode and
    mtime are all as before (only the content and ctime differ). Another length: the table is rewritten into
    the same file (same inode, new size).
    """
    changed = 0
    for path in arrow_files(directory):
        data = path.read_bytes()
        if old.encode() not in data:
            continue
        changed += 1
        if len(old.encode()) == len(new.encode()):
            st = os.stat(path)
            with open(path, "r+b") as fh:
                fh.write(data.replace(old.encode(), new.encode()))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            continue
        with pa.OSFile(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
        rows = _replace(table.to_pylist(), old, new)
        edited = pa.Table.from_pylist(rows, schema=table.schema)
        with open(path, "r+b") as fh:
            fh.truncate(0)
            with pa.ipc.new_stream(fh, edited.schema) as writer:
                writer.write_table(edited)
    return changed
