"""Files and directories that appear whole or not at all: the one atomic writer of echo_trl.

Why: a process killed half-way (``kill -9``, Ctrl-C, a full disk) must leave either the previous file or
directory or the new one, never a mix, and a reader must never see another process's half-written data.

How, always the same: write into a temporary sibling (same directory, so same filesystem), then move it
in place with one ``os.replace`` / ``rename``; the temporary is removed whatever happens.

* :func:`write_file`: a file's bytes or text (``durable``: fsync the data and the directory too, for
  files whose loss after a power cut matters, e.g. a collection's settings);
* :func:`staging_dir`: an empty temporary sibling directory, removed when the block ends;
* :func:`replace_dir`: swap a finished directory in for an existing one (Linux ``renameat2``
  ``RENAME_EXCHANGE``; elsewhere two renames, the old copy parked) and :func:`recover_dir` for what a
  killed swap left; :func:`move_dir_into_place`: the first finished directory wins (caches two
  processes may build at once).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["fsync_dir", "move_dir_into_place", "recover_dir", "replace_dir", "staging_dir", "write_file"]

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename in it survives a power cut); best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file(path: str | Path, data: str | bytes, *, durable: bool = True, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8) whole or not at all.

    The data goes to a new hidden sibling (``.NAME.RANDOM.tmp``, created exclusively and never through a
    link, ``mode`` less the umask), which is renamed over ``path``. ``durable``: fsync the file before the
    rename and the directory after it (else only a process crash is covered, not a power cut).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if durable:
        fsync_dir(path.parent)


@contextlib.contextmanager
def staging_dir(path: str | Path, *, prefix: str | None = None) -> Iterator[Path]:
    """An empty temporary sibling directory of ``path`` (``prefix`` default ``.NAME.tmp-``); whatever is at
    its path when the block ends is removed (the new output that failed, or the old one swapped out)."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=prefix or f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2``); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):  # no renameat2 (old glibc, macOS) or no libc handle (Windows)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_dir(new: Path, path: Path) -> Path | None:
    """Put the directory ``new`` (a :func:`staging_dir`) at ``path``; returns where the previous directory
    now is, for the caller to remove (``new`` itself after a swap, a parked ``.NAME.old-*`` after the
    two-rename fallback), or ``None`` when there was none."""
    if not path.exists():
        os.rename(new, path)
        return None
    if _exchange(new, path):
        return new
    parked = path.parent / f".{path.name}.old-{new.name.rsplit('-', 1)[-1]}"
    os.rename(path, parked)
    os.rename(new, path)
    return parked


def recover_dir(path: Path) -> None:
    """Clean what killed :func:`replace_dir` runs left beside ``path`` (call it holding the writer's lock): a
    parked copy is restored when the swap died between its two renames, stale staging dirs are removed."""
    parked = sorted(path.parent.glob(f".{path.name}.old-*"))
    if parked and not os.path.lexists(path):  # killed between the two renames of the fallback swap
        os.rename(parked.pop(), path)
    for stale in [*path.parent.glob(f".{path.name}.tmp-*"), *parked]:
        shutil.rmtree(stale, ignore_errors=True)


def move_dir_into_place(new: Path, path: Path, finished: Callable[[Path], bool]) -> bool:
    """Rename the directory ``new`` to ``path``; a ``finished`` directory already there wins (``new`` is left
    for the caller to remove), an unfinished one is replaced. False when ``path`` kept being replaced."""
    for _ in range(2):
        try:
            os.rename(new, path)
            return True
        except OSError:  # path exists (a non-empty directory cannot be renamed over)
            if finished(path):
                return True
            shutil.rmtree(path, ignore_errors=True)  # unfinished: replace it
    return False
