"""A small tmpfs the test mounts (a disk that fills up), unmounted afterwards; skipped where mounting is impossible."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(directory: Path, size: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` bytes at ``directory`` for the block (datasets may still map files in it when
    the block ends: the unmount is lazy, so it never fails the test)."""
    if os.name != "posix" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8) (a full disk is simulated with one)")
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True)


def fill(directory: Path, leave: int) -> None:
    """Take the tmpfs's free space down to about ``leave`` bytes (a file named ``ballast``)."""
    free = shutil.disk_usage(directory).free
    with open(directory / "ballast", "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
