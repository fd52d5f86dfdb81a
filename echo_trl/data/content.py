"""What a dataset holds, as a key: its ``datasets`` fingerprint plus a content hash of each Arrow file.

``datasets`` fingerprints a ``save_to_disk`` directory by the ``_fingerprint`` in its ``state.json``,
which nothing updates when an Arrow file is edited in place (a tool output redacted, rows fixed by
hand). Every cache derived from such a dataset (token columns, starting-model log-probs, a cast)
would then keep serving the old text. :func:`dataset_content_key` adds the SHA-256 of every Arrow
file the dataset reads, so an edited file always gives a new key.

Hashing is a full read of the data, so each file's digest is remembered in a small record under
:func:`~echo_trl.data.cache_dir.cache_home` (``digests/``), keyed by the file's path, size, ``mtime_ns``,
``ctime_ns``, inode and device: a later run re-reads a file only when one of those changed. ``ctime`` changes on every
write and cannot be set back (``touch`` restores ``mtime`` only), and a file modified within
:data:`RACY_SECONDS` of being hashed is not remembered (a second write in the same timestamp tick
would keep every stat field; git's "racy" rule).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import datasets

from ..io.atomic import write_file
from .cache_dir import cache_home

__all__ = ["file_digest", "dataset_content_key", "with_content_fingerprint"]

#: Bumped when the digest records change meaning.
DIGEST_VERSION = 1
#: A file modified this recently when hashed is hashed again next time (timestamps are coarser than writes).
RACY_SECONDS = 2.0


def _stat_key(path: str) -> list:
    st = os.stat(path)
    return [DIGEST_VERSION, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _record_path(path: str) -> Path:
    return cache_home() / "digests" / f"{hashlib.sha256(path.encode()).hexdigest()[:24]}.json"


def hash_file(path: str) -> str:
    """SHA-256 of the file's bytes (a full read)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _remember(record: Path, content: dict) -> None:
    """Write the record atomically (:func:`echo_trl.io.atomic.write_file`: a temporary sibling, then
    ``os.replace``); a record that cannot be written is only a lost shortcut, never an error."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        write_file(record, json.dumps(content), durable=False, mode=0o600)
    except OSError:
        pass


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read once per file version (see the module docstring)."""
    path = os.path.realpath(path)
    record = _record_path(path)
    key = _stat_key(path)
    try:
        known = json.loads(record.read_text(encoding="utf-8"))
        if known.get("path") == path and known.get("key") == key:
            return known["sha256"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    digest = hash_file(path)
    settled = time.time_ns() - key[2] > RACY_SECONDS * 1e9
    if _stat_key(path) == key and settled:  # unchanged while it was read, and not written in the current tick
        _remember(record, {"path": path, "key": key, "sha256": digest})
    return digest


def dataset_content_key(ds: datasets.Dataset, content_addressed: Path | None = None) -> str:
    """``ds``'s fingerprint (its transforms) joined with the content hash of every Arrow file it reads.

    Files under ``content_addressed`` (a cache whose directory names are already keys of what they hold, as the
    token cache's are) are named by their path there instead of read: hashing a 100k-episode token cache is
    ~9 GB read before the first step."""
    h = hashlib.sha256(str(ds._fingerprint).encode())
    root = None if content_addressed is None else os.path.realpath(content_addressed) + os.sep
    for f in ds.cache_files:
        path = os.path.realpath(f["filename"])
        h.update(b"\0" + (path[len(root) :] if root and path.startswith(root) else file_digest(path)).encode())
    return h.hexdigest()[:16]


def with_content_fingerprint(ds: datasets.Dataset) -> datasets.Dataset:
    """``ds`` (as loaded from disk) re-fingerprinted by :func:`dataset_content_key`, so every ``datasets``
    cache derived from it (``map``, ``cast``) is keyed on the Arrow data, not on ``state.json``.

    A dataset with no Arrow files (in memory) is returned as it is: ``datasets`` fingerprints it by content.
    """
    if not ds.cache_files:
        return ds
    fmt = ds.format
    keyed = datasets.Dataset(ds.data, info=ds.info, split=ds.split, fingerprint=dataset_content_key(ds))
    keyed.set_format(
        type=fmt["type"], columns=fmt["columns"], output_all_columns=fmt["output_all_columns"], **fmt["format_kwargs"]
    )
    return keyed
