"""A resumable directory of JSONL files: one writer at a time, whole lines only, settings kept.

Why: a long collection (hours of episodes) is killed sometimes (``kill -9``, a full disk, Ctrl-C). What it
wrote must stay readable and the rerun must continue it, never mix it with another run or read half a record.

How: each record is appended to its file as one write of one whole line, then the file is fsynced, so a
killed writer loses only what was in flight. Should it die inside a write, the next writer cuts the
unterminated last line (:meth:`JsonlStore.repair`) before anything else. A lock file (``fcntl.flock``)
keeps a second writer out, and a state file keeps the settings of the first run: a rerun with other
settings is refused, naming the first that differs. What the records mean (keys, which file a record goes
to) is the caller's: a subclass or a caller adds that.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

from ..errors import EchoTrlError
from . import strict_json
from .atomic import write_file

try:
    import fcntl
except ImportError:  # no flock (Windows): a second writer is not detected
    fcntl = None

__all__ = ["JsonlStore", "StoreError"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: The most a state file may hold (its settings are a few hundred bytes).
STATE_MAX_BYTES = 1 << 20


def _suppress_os_error():
    import contextlib

    return contextlib.suppress(OSError)


class StoreError(EchoTrlError):
    """The directory cannot be written into (other settings, another writer, unreadable state)."""


class JsonlStore:
    """A directory of ``pattern`` JSONL files written by one process; each record one fsynced line.

    ``lock_file`` and ``state_file`` are names inside the directory; ``writer`` names the kind of process
    in the error a second one gets. ``error`` is the exception class raised (a subclass may narrow it).
    """

    error: type[EchoTrlError] = StoreError

    def __init__(self, out: Path, *, pattern: str, lock_file: str, state_file: str, writer: str = "writer"):
        self.out = Path(out)
        self.pattern, self.lock_file, self.state_file, self.writer = pattern, lock_file, state_file, writer
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self.written = 0
        self.repaired: list[str] = []

    # -- ownership and settings ----------------------------------------------------------------

    def acquire(self) -> None:
        """Hold the directory's writer lock (a one-line error while another writer holds it), then cut the
        torn last line a killed run may have left (:meth:`repair`)."""
        if fcntl is not None:
            fd = os.open(self.out / self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise self.error(f"--output {self.out}: another {self.writer} holds {self.lock_file} there") from None
            self._lock_fd = fd
        self.repair()

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Record ``settings`` on the first run; on a rerun refuse any that differ (named, both values)."""
        path = self.out / self.state_file
        if os.path.lexists(path):
            known = self._read_state(path)
            changed = [k for k in sorted(set(known) | set(settings)) if known.get(k) != settings.get(k)]
            if changed:
                k = changed[0]
                raise self.error(
                    f"--output {self.out} was collected with {k}={known.get(k)!r}, this run asks {settings.get(k)!r} "
                    f"({len(changed)} setting(s) differ: {', '.join(changed)}): continue with the same settings "
                    "or collect into another --output"
                )
            return
        write_file(path, json.dumps({"settings": settings}, indent=2, sort_keys=True, allow_nan=False) + "\n")

    def _read_state(self, path: Path) -> dict[str, Any]:
        """The settings of the state file, read bounded (a regular file of at most :data:`STATE_MAX_BYTES`, no
        link followed, never blocking on a FIFO) and type-checked: anything else is a one-line error."""

        def unreadable(why: str) -> StoreError:
            return self.error(f"{path}: unreadable ({why}); remove it or use another --output")

        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            raise unreadable(exc.strerror or str(exc)) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise unreadable("not a regular file")
            if info.st_size > STATE_MAX_BYTES:
                raise unreadable(f"{info.st_size} bytes, more than the {STATE_MAX_BYTES} a state file can hold")
            data = os.read(fd, STATE_MAX_BYTES + 1)
        except OSError as exc:
            raise unreadable(exc.strerror or str(exc)) from None
        finally:
            os.close(fd)
        try:
            known = strict_json.loads(data)
        except strict_json.StrictJSONError as exc:
            raise unreadable(str(exc)) from None
        if not isinstance(known, dict) or not isinstance(known.get("settings"), dict):
            raise unreadable('expected {"settings": {...}}')
        return known["settings"]

    # -- files ---------------------------------------------------------------------------------

    def paths(self) -> list[Path]:
        return sorted(self.out.glob(self.pattern))

    def repair(self) -> None:
        """Make every file end with a whole line, reporting each change in :attr:`repaired`.

        A last line without its newline is either a complete record (a run stopped between the record and its
        newline: the newline is added) or a record a ``kill -9`` interrupted (cut; the rerun writes it again).
        Complete lines are never touched. Links are never followed and only regular files are opened: a link, a
        FIFO or a directory matching the pattern is a one-line error (the collection would read or append to it).
        """
        for path in self.paths():
            try:
                fd = os.open(path, os.O_RDWR | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
            except OSError as exc:
                kind = "a symbolic link" if path.is_symlink() else (exc.strerror or str(exc))
                raise self.error(f"{path}: {kind}: a {self.writer} writes only regular files; move it away") from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise self.error(f"{path}: not a regular file: a {self.writer} writes regular files only; move it")
                with os.fdopen(os.dup(fd), "rb+") as fh:
                    self._repair_one(path, fh)
            finally:
                os.close(fd)

    def _repair_one(self, path: Path, fh) -> None:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        tail = min(size, 1 << 20)
        while True:  # find the last newline, reading backwards in chunks
            fh.seek(size - tail)
            cut = fh.read(tail).rfind(b"\n")
            if cut >= 0 or tail == size:
                break
            tail = min(size, tail * 2)
        keep = size - tail + cut + 1 if cut >= 0 else 0
        fh.seek(keep)
        try:
            strict_json.loads(fh.read(size - keep))
        except strict_json.StrictJSONError:
            fh.truncate(keep)
            self.repaired.append(f"{path.name}: cut {size - keep} bytes of an episode left half-written")
        else:
            fh.seek(size)
            fh.write(b"\n")
            fh.flush()
            os.fsync(fh.fileno())
            self.repaired.append(f"{path.name}: added the newline its complete last record lacked")

    def append(self, name: str, record: Any) -> None:
        """Append ``record`` to the file ``name`` as one write of one whole strict-JSON line, then fsync.

        A record that is not strict JSON (NaN, infinity, a lone surrogate) is refused before anything is
        written; a write that fails part-way (a full disk) is cut back to the file's previous end, so no torn
        line is ever left, and the error says the same command continues."""
        try:
            data = strict_json.dumps(record) + b"\n"
        except strict_json.StrictJSONError as exc:
            raise self.error(f"{self.out / name}: record not written, it is not strict JSON: {exc}") from None
        with self._lock:
            fd = os.open(self.out / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o644)
            try:
                start = os.fstat(fd).st_size
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except OSError as exc:
                    with _suppress_os_error():
                        os.ftruncate(fd, start)
                    raise self.error(
                        f"{self.out / name}: cannot write the record ({exc.strerror or exc}); nothing half-written "
                        "was left: free space and rerun the same command to continue"
                    ) from None
            finally:
                os.close(fd)
            self.written += 1
