"""Processes and ports: what a test counts before and after, and what it runs under."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def descendant_pids(pid: int | None = None) -> set[int]:
    """PIDs of all live descendants of ``pid`` (default: this process), read from /proc."""
    pid = os.getpid() if pid is None else pid
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if fields[0] != "Z":
                    parent[int(d.name)] = int(fields[1])
            except (OSError, ValueError):
                pass
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (for torch.distributed / accelerate rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unprivileged() -> list[str]:
    """A command prefix under which file permissions apply (root ignores them without it)."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: read-only directories cannot be tested")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
