"""Session-wide memory and process caps for one sandbox, through a cgroup where the host allows one.

rlimits are per process (RLIMIT_AS) or per user namespace (RLIMIT_NPROC); a cgroup caps the
sandbox as a whole: the memory of all its processes together (``memory.max``), and all its
tasks (``pids.max``). Used when this process may create child cgroups with the memory and pids
controllers: cgroup v2 (a writable, delegated ``cgroup.subtree_control``), else the cgroup v1
``memory`` and ``pids`` hierarchies. Otherwise :func:`detect` says why, and rlimits alone apply.

A sandbox joins its cgroups before anything runs: the command is prefixed by a one-line shell
that writes its own pid into each ``cgroup.procs`` and then execs bwrap (children inherit).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

_counter = itertools.count()


@dataclass(frozen=True)
class CgroupSupport:
    """Where sandbox cgroups can be made: controller -> parent dir (``{}`` = none, see ``reason``)."""

    version: str = ""
    parents: dict[str, Path] = field(default_factory=dict)
    reason: str = ""

    def describe(self) -> str:
        if not self.version:
            return f"no cgroup ({self.reason})"
        where = ", ".join(str(p) for p in sorted(set(self.parents.values())))
        return f"cgroup {self.version} ({where})" + (f"; not v2: {self.reason}" if self.reason else "")


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of each cgroup mount, from /proc/self/mountinfo."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields, (fstype, _src, opts) = left.split(), right.split()[:3]
        if fstype in ("cgroup", "cgroup2"):
            out.append((fields[3], fields[4], fstype, opts))
    return out


def _under(mount_root: str, mount_point: str, path: str) -> Path:
    rel = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
    return Path(mount_point, rel).resolve() if rel != "." else Path(mount_point)


def detect() -> CgroupSupport:
    """Find a cgroup we may create children in with both the memory and the pids controller."""
    try:
        own = dict(line.split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
        mounts = _mounts()
    except (OSError, ValueError) as exc:
        return CgroupSupport(reason=f"cannot read /proc/self/cgroup or mountinfo: {exc}")
    reasons = []
    for root, point, fstype, _opts in mounts:
        if fstype == "cgroup2" and "" in own:
            d = _under(root, point, own[""])
            controllers = (
                set((d / "cgroup.controllers").read_text().split()) if (d / "cgroup.controllers").exists() else set()
            )
            if not {"memory", "pids"} <= controllers:
                reasons.append(f"cgroup v2 {d} delegates only {sorted(controllers) or 'nothing'}")
            elif not os.access(d, os.W_OK):
                reasons.append(f"cgroup v2 {d} is not writable")
            elif _enable_v2(d):
                return CgroupSupport("v2", {"memory": d, "pids": d})
            else:
                reasons.append(f"cgroup v2 {d}: cannot enable memory+pids for children")
    parents = {}
    for root, point, fstype, opts in mounts:
        for ctl in ("memory", "pids"):
            if fstype == "cgroup" and ctl in opts.split(",") and ctl in own:
                d = _under(root, point, own[ctl])
                if os.access(d, os.W_OK):
                    parents[ctl] = d
    if set(parents) == {"memory", "pids"}:
        return CgroupSupport("v1", parents, reason="; ".join(reasons))
    reasons.append("no writable cgroup v1 memory+pids hierarchies")
    return CgroupSupport(reason="; ".join(reasons))


def remove_stale(support: CgroupSupport) -> None:
    """Remove sandbox cgroups left by processes that were SIGKILLed (and so could not clean up)."""
    for parent in set(support.parents.values()):
        for d in parent.glob("echo_trl_sandbox_*"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(d.name.split("_")[3]), 0)
                continue
            remove([d], timeout=0.5)


def _enable_v2(d: Path) -> bool:
    try:
        if not {"memory", "pids"} <= set((d / "cgroup.subtree_control").read_text().split()):
            (d / "cgroup.subtree_control").write_text("+memory +pids")
        return True
    except OSError:  # e.g. EBUSY: processes live in d itself (the no-internal-process rule)
        return False


def create(support: CgroupSupport, *, memory: int | None, processes: int | None) -> list[Path]:
    """Make this sandbox's cgroup(s) with the caps set; returns the dirs (join with :func:`join_prefix`)."""
    name = f"echo_trl_sandbox_{os.getpid()}_{next(_counter)}"
    files = {
        "memory": {"v2": "memory.max", "v1": "memory.limit_in_bytes"},
        "pids": {"v2": "pids.max", "v1": "pids.max"},
    }
    dirs: list[Path] = []
    try:
        for ctl, value in (("memory", memory), ("pids", processes)):
            d = support.parents[ctl] / name
            if d not in dirs:
                d.mkdir()
                dirs.append(d)
            if value is not None:
                (d / files[ctl][support.version]).write_text(str(int(value)))
        if support.version == "v2" and memory is not None and (dirs[0] / "memory.swap.max").exists():
            (dirs[0] / "memory.swap.max").write_text("0")
    except OSError:
        remove(dirs)
        raise
    return dirs


def join_prefix(dirs: list[Path]) -> list[str]:
    """A command prefix that moves itself into ``dirs`` and then execs the rest of the command line."""
    joins = "".join(f"echo 0 > {shlex.quote(str(d / 'cgroup.procs'))} || exit 125; " for d in dirs)
    return ["/bin/sh", "-c", joins + 'exec "$@"', "echo-trl-cgroup"]


def remove(dirs: list[Path], timeout: float = 5.0) -> None:
    """Kill whatever is still in ``dirs`` and remove them (a cgroup can only go once it is empty)."""
    deadline = time.monotonic() + timeout
    for d in dirs:
        while d.exists():
            with contextlib.suppress(OSError):
                if (d / "cgroup.kill").exists():
                    (d / "cgroup.kill").write_text("1")
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)
                d.rmdir()
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
