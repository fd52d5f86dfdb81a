"""Host-side I/O at the sandbox boundary: what goes in is sealed, what comes back is bounded, nothing is followed.

The host runs with the user's rights (often root); generated code runs in the sandbox. The host
never follows a path that generated code could have written:

* inputs (server code, verifier spec, database images) go in as sealed memfds, fresh per start:
  written once, then ``F_SEAL_WRITE``-sealed, so no process, the sandbox included, can change them;
* outputs (verifier result, logs) come back through memfds or files the host created itself and
  passed as descriptors; they are read through that descriptor only, checked to be regular files
  and bounded in size (:func:`read_bounded`, :func:`read_tail`);
* host directories (runtime dirs under the temp dir) are created private (0700) and removed by
  :func:`remove_tree`, which opens nothing through a symbolic link and keeps no recursion or
  descriptor per level (a 3,000-deep tree is as easy as a flat one).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import uuid
from pathlib import Path

SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
OWNER_FILE = "owner.pid"


class TooLarge(ValueError):
    """What came back from the sandbox is over its size cap (it was not read)."""

    def __init__(self, what: str, size: int, limit: int):
        super().__init__(f"{what} is {size} bytes, over the {limit}-byte cap (not read)")
        self.size, self.limit = size, limit


class NotRegular(ValueError):
    """What came back from the sandbox is not a regular file (a FIFO, a device, a directory ...)."""


def sealed_memfd(data: bytes, name: str) -> int:
    """A read-only-forever anonymous file holding ``data`` (``F_SEAL_WRITE``: not even the sandbox can write it)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def output_memfd(name: str) -> int:
    """An anonymous file for the sandbox to write (a result, a log): no path, so nothing to swap."""
    return os.memfd_create(name, os.MFD_CLOEXEC)


def check_regular(fd: int, what: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(f"{what} is not a regular file (mode {stat.filemode(st.st_mode)})")
    return st


def read_bounded(fd: int, limit: int, what: str) -> bytes:
    """The whole content of the regular file open at ``fd`` (from offset 0), or :class:`TooLarge` past ``limit``."""
    st = check_regular(fd, what)
    if st.st_size > limit:
        raise TooLarge(what, st.st_size, limit)
    return _pread(fd, 0, st.st_size)


def read_tail(fd: int, limit: int, what: str = "log") -> bytes:
    """At most the last ``limit`` bytes of the regular file open at ``fd`` (empty when it is not one)."""
    try:
        st = check_regular(fd, what)
    except (OSError, NotRegular):
        return b""
    start = max(0, st.st_size - limit)
    return _pread(fd, start, st.st_size - start)


def _pread(fd: int, offset: int, size: int) -> bytes:
    chunks, done = [], 0
    while done < size:
        chunk = os.pread(fd, min(size - done, 1 << 20), offset + done)
        if not chunk:  # shrunk meanwhile: what was there
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def create_private_file(path: Path) -> int:
    """Create ``path`` (a new file in a host-private directory) for writing; never follows or reuses a link."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def open_regular(path: Path, flags: int = os.O_RDONLY) -> int:
    """Open an existing regular file without following a link at its last component."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        check_regular(fd, str(path))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_run_dir(prefix: str) -> Path:
    """A private (0700) directory in the temp dir that names its owner process (for :func:`remove_stale_dirs`)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    fd = create_private_file(root / OWNER_FILE)
    with os.fdopen(fd, "w") as fh:
        fh.write(str(os.getpid()))
    return root


def remove_stale_dirs(pattern: str = "echo_trl_awm_*") -> list[str]:
    """Remove run dirs whose owner process is gone (it was SIGKILLed); never raises for one bad dir.

    Only real directories owned by this user are considered (a link or another user's directory
    of the same name in the shared temp dir is left alone), and the owner file is read without
    following a link and bounded.
    """
    removed = []
    for d in Path(tempfile.gettempdir()).glob(pattern):
        try:
            st = os.lstat(d)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            fd = open_regular(d / OWNER_FILE)
            try:
                pid = int(read_bounded(fd, 32, str(d / OWNER_FILE)))
            finally:
                os.close(fd)
            os.kill(pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                remove_tree(d)
                removed.append(str(d))
        except (OSError, ValueError):
            continue
    return removed


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything under it without recursion and without following links.

    Subdirectories are moved up to the top directory as they are found, so at most two
    descriptors are open whatever the depth; a link is unlinked, never followed. A missing
    ``path`` is not an error; anything else that cannot be removed raises ``OSError``.
    """
    path = Path(os.path.abspath(path))
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            top = os.open(path.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):  # ELOOP: a link, never followed
                raise
            os.unlink(path.name, dir_fd=parent)
            return
        try:
            pending: list[str | None] = [None]
            while pending:
                name = pending.pop()
                fd = top if name is None else os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                try:
                    with os.scandir(fd) as it:
                        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                    for entry, is_dir in entries:
                        if is_dir:
                            moved = f".echo_trl_rm_{uuid.uuid4().hex}"
                            os.rename(entry, moved, src_dir_fd=fd, dst_dir_fd=top)
                            pending.append(moved)
                        else:
                            os.unlink(entry, dir_fd=fd)
                finally:
                    if name is not None:
                        os.close(fd)
                if name is not None:
                    os.rmdir(name, dir_fd=top)
        finally:
            os.close(top)
        os.rmdir(path.name, dir_fd=parent)
    finally:
        os.close(parent)
