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
import threading
from pathlib import Path
from typing import Any

from ..errors import EchoTrlError
from .atomic import write_file

try:
    import fcntl
except ImportError:  # no flock (Windows): a second writer is not detected
    fcntl = None

__all__ = ["JsonlStore", "StoreError"]


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
        if path.exists():
            try:
                known = json.loads(path.read_text(encoding="utf-8"))["settings"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise self.error(f"{path}: unreadable ({exc}); remove it or use another --output") from None
            changed = [k for k in sorted(set(known) | set(settings)) if known.get(k) != settings.get(k)]
            if changed:
                k = changed[0]
                raise self.error(
                    f"--output {self.out} was collected with {k}={known.get(k)!r}, this run asks {settings.get(k)!r} "
                    f"({len(changed)} setting(s) differ: {', '.join(changed)}): continue with the same settings "
                    "or collect into another --output"
                )
            return
        write_file(path, json.dumps({"settings": settings}, indent=2, sort_keys=True) + "\n")

    # -- files ---------------------------------------------------------------------------------

    def paths(self) -> list[Path]:
        return sorted(self.out.glob(self.pattern))

    def repair(self) -> None:
        """Cut a last line without its newline: a record a ``kill -9`` interrupted while it was being appended
        (the rerun writes it again). Complete lines are never touched."""
        for path in self.paths():
            with open(path, "rb+") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size == 0:
                    continue
                fh.seek(size - 1)
                if fh.read(1) == b"\n":
                    continue
                tail = min(size, 1 << 20)
                while True:  # find the last newline, reading backwards in chunks
                    fh.seek(size - tail)
                    cut = fh.read(tail).rfind(b"\n")
                    if cut >= 0 or tail == size:
                        break
                    tail = min(size, tail * 2)
                keep = size - tail + cut + 1 if cut >= 0 else 0
                fh.truncate(keep)
                self.repaired.append(f"{path.name}: cut {size - keep} bytes of an episode left half-written")

    def append(self, name: str, record: Any) -> None:
        """Append ``record`` to the file ``name`` as one write of one whole JSON line, then fsync."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        with self._lock:
            fd = os.open(self.out / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            self.written += 1
