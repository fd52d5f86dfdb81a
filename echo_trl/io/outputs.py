"""Output directories: checked before the work starts, replaced atomically, one writer at a time.

Why: a build killed half-way (``kill -9``, Ctrl-C, a full disk) must leave the previous output
exactly as it was, two builds into one directory must not interleave or silently overwrite
each other, and an output path that cannot work (a file, read-only, under a file) must be a
one-line error before minutes of work, not a traceback after them.

How: the new output is written into a temporary sibling directory (same filesystem), then
swapped in with one ``renameat2(RENAME_EXCHANGE)`` (Linux; elsewhere two renames, and a run
finding only the parked old copy restores it). Writers hold ``fcntl.flock`` on a sibling
``.NAME.lock`` file. Guarantees cover process crashes, not power loss (nothing is fsynced).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..errors import EchoTrlError
from .atomic import recover_dir, replace_dir, staging_dir

__all__ = ["check_output_dir", "atomic_output_dir", "output_lock", "is_disk_full", "disk_full_error", "human_bytes"]

try:
    import fcntl
except ImportError:  # Windows: no flock; writes stay atomic, concurrent writers are not detected
    fcntl = None


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised while handling) is "no space left": by errno (a full disk or
    quota), or by the system's wording where a library passes only the text on (arrow, safetensors)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def disk_full_error(path: str | Path, needs: int | None, after: str = "nothing was left half-written") -> EchoTrlError:
    """The one-line error for a write that ran out of space: the path, what it needs and what is free there,
    then ``after`` (what state the write left)."""
    try:
        free = f"{human_bytes(shutil.disk_usage(_nearest_existing(Path(path).absolute())).free)} free"
    except OSError:
        free = "free space unknown"
    need = f"needs about {human_bytes(needs)}" if needs else "needs more space"
    return EchoTrlError(f"{path}: no space left on device ({need}, {free}); {after}")


def _nearest_existing(path: Path) -> Path:
    here = path
    while not os.path.lexists(here) and here != here.parent:
        here = here.parent
    return here


def _probe_writable(directory: Path, shown: Path, flag: str) -> None:
    """Create and remove a file: the only check that is right for read-only mounts, ACLs and root."""
    try:
        fd, name = tempfile.mkstemp(prefix=".echo-trl-probe-", dir=directory)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise EchoTrlError(f"{flag} {shown}: cannot write in {directory} ({exc.strerror or exc})") from None


def check_output_dir(path: str | Path, *, replace_if: str | None = None, flag: str = "--output") -> Path:
    """Check (and for writing into, create) an output directory; a one-line error if it cannot work.

    ``replace_if=None``: files are written into the directory (``capture`` appends), so it is
    created and must be writable. ``replace_if=MARKER``: the directory is replaced as a whole
    (:func:`atomic_output_dir`), so its parent must be writable, and an existing directory must be
    writable too (read-only means "keep this") and be empty or hold ``MARKER`` (a previous output
    of this kind), so that a mistyped ``--output ~`` never replaces a directory of other things.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise EchoTrlError(f"{flag} {out}: is a file, not a directory")
    existing = _nearest_existing(out.absolute())
    if not existing.is_dir():
        raise EchoTrlError(f"{flag} {out}: is under {existing}, which is not a directory")
    if replace_if is None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise EchoTrlError(f"{flag} {out}: cannot create it ({exc.strerror or exc})") from None
        _probe_writable(out, out, flag)
        return out
    if out.is_dir():
        if any(out.iterdir()) and not (out / replace_if).exists():
            raise EchoTrlError(
                f"{flag} {out}: exists and is not a previous output (no {replace_if}); "
                "refusing to replace it: choose a new or empty directory"
            )
        _probe_writable(out, out, flag)
        existing = out.absolute().parent
    _probe_writable(existing, out, flag)
    return out


@contextlib.contextmanager
def output_lock(path: str | Path) -> Iterator[Path]:
    """Hold the sibling ``.NAME.lock`` of ``path``; a second writer gets a one-line error at once."""
    out = Path(os.path.realpath(path))
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = out.parent / f".{out.name}.lock"
    if fcntl is None:
        yield lock
        return
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise EchoTrlError(
                f"{path}: another process{f' (pid {holder})' if holder else ''} is writing this "
                f"output (it holds {lock}); wait for it or choose another output"
            ) from None
        # The previous holder removes the file when done: lock only the file that is there now.
        try:
            mine, there = os.fstat(fd), os.stat(lock)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield lock
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output_dir(
    path: str | Path, *, replace_if: str, flag: str = "--output", needs: int | None = None
) -> Iterator[Path]:
    """Yield an empty temporary sibling of ``path``; when the block succeeds it replaces ``path``.

    Until the swap the previous output is untouched; if the block raises (or the process dies)
    the temporary directory is removed (or removed by the next writer) and ``path`` is as it was.
    ``replace_if`` is :func:`check_output_dir`'s marker of a replaceable previous output; ``needs`` (bytes, an
    estimate) is what a full disk's error says the output takes.
    """
    out = Path(os.path.realpath(path))  # a link to the output stays a link to the new output
    check_output_dir(path, replace_if=replace_if, flag=flag)
    with output_lock(out), contextlib.ExitStack() as stack:
        check_output_dir(path, replace_if=replace_if, flag=flag)  # again, now that no one else writes
        try:
            recover_dir(out)
            tmp = stack.enter_context(staging_dir(out))  # removed at the end: the failed new output or the old one
            os.chmod(tmp, 0o777 & ~_umask())
        except OSError as exc:
            raise EchoTrlError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from None
        try:
            yield tmp
            parked = replace_dir(tmp, out)
            if parked is not None and parked != tmp:
                shutil.rmtree(parked, ignore_errors=True)
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(f"{flag} {path}", needs, "the previous output is unchanged") from None
            raise EchoTrlError(
                f"{flag} {path}: cannot write ({exc.strerror or exc}); the previous output is unchanged"
            ) from None
