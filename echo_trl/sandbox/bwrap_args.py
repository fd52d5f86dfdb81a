"""The bubblewrap command line of one sandbox, and the limits and layers it applies (see :mod:`.bwrap`)."""

from __future__ import annotations

import os
import shutil
import site
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import cgroups

SANDBOX_UID = 65534  # "nobody"
WORK_DIR = "/tmp"  # the one writable directory inside: a sized tmpfs of the sandbox's own
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class Limits:
    """rlimits for each sandboxed process (``None`` = leave unlimited); ``processes`` caps the sandbox."""

    address_space: int | None = 4 << 30
    cpu_seconds: int | None = 3600
    file_size: int | None = 128 << 20
    open_files: int | None = 1024
    processes: int | None = 128  # uvicorn + anyio's worker threads count too; per sandbox
    session_memory: int | None = 4 << 30  # all processes of the sandbox together (cgroup only)
    disk: int = 256 << 20  # size of the sandbox's writable tmpfs (its pages count as its memory too)

    def prlimit_args(self) -> list[str]:
        out = ["--core=0"]
        for flag, value in (
            ("as", self.address_space),
            ("cpu", self.cpu_seconds),
            ("fsize", self.file_size),
            ("nofile", self.open_files),
            ("nproc", self.processes),
        ):
            if value is not None:
                out.append(f"--{flag}={int(value)}")
        return out


SERVER_LIMITS = Limits()
VERIFIER_LIMITS = Limits(
    address_space=2 << 30,
    cpu_seconds=None,
    file_size=128 << 20,  # it copies both databases into its tmpfs
    open_files=64,
    processes=32,
    session_memory=2 << 30,
    disk=320 << 20,
)


@dataclass(frozen=True)
class Containment:
    """How generated code runs here: ``bwrap`` set = contained; ``None`` = uncontained (explicitly unsafe)."""

    bwrap: str | None = None
    drop_root: bool = False  # we are root: bwrap runs as SANDBOX_UID behind an outer root bwrap
    session: cgroups.CgroupSupport = field(default_factory=lambda: cgroups.CgroupSupport(reason="not used"))
    keyring: str = ""  # why a sandbox cannot get a fresh session keyring here ("" = it does)
    notes: tuple[str, ...] = field(default=())

    @property
    def contained(self) -> bool:
        return self.bwrap is not None

    def applied(self) -> list[str]:
        """Human-readable list of the layers in force (for capture logs and episode metadata)."""
        if not self.contained:
            return [
                "NONE: generated code runs uncontained (unsafe_no_sandbox / --unsafe-no-sandbox)",
                "rlimits per process",
                "scrubbed environment",
                "own process group",
            ]
        return [
            "bubblewrap: user namespace, uid/gid 65534 on the host, no capabilities",
            "pid, net, ipc, uts, cgroup namespaces; no nested user namespaces",
            "seccomp: keyrings, ptrace, io_uring, userfaultfd, bpf, perf_event_open, namespaces, mounts, "
            "kexec, modules denied (EPERM); sockets other than unix/inet/inet6 (EAFNOSUPPORT)",
            "fresh session keyring" if not self.keyring else f"host session keyring kept ({self.keyring})",
            "fresh /proc, minimal read-only /dev",
            "read-only root: /usr, Python runtime, named files; one writable /tmp: a sized nosuid,nodev tmpfs "
            "of its own; inputs sealed, outputs through descriptors",
            "die-with-parent (a pid namespace dying with the host process), new session (no terminal), "
            "cleared environment",
            "rlimits per process (AS, CPU, FSIZE, NOFILE, CORE=0), RLIMIT_NPROC per sandbox",
            f"session memory + processes: {self.session.describe()}"
            if self.session.version
            else f"session: RLIMIT_NPROC only, {self.session.describe()}",
        ]

    def to_json(self) -> dict:
        return {"contained": self.contained, "applied": self.applied(), "notes": list(self.notes)}


UNSAFE = Containment(notes=("unsafe_no_sandbox requested explicitly",))


# --------------------------------------------------------------------------------------------
# Commands


def base_env(extra: dict[str, str] | None = None, *, home: str) -> dict[str, str]:
    """The whole environment generated code sees: nothing inherited, no tokens."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "SQLITE_TMPDIR": home,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONHASHSEED": "0",
        "NO_PROXY": "*",
    }
    env.update(extra or {})
    return env


def _python_roots() -> list[str]:
    """What the sandboxed Python needs, read-only: its prefix(es) and package directories."""
    paths = [
        sys.base_prefix,
        sys.prefix,
        os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
        *site.getsitepackages(),
    ]
    return [p for p in paths if os.path.isdir(p) and os.path.realpath(p) != "/"]  # never the host's whole root


def _outermost(paths: list[str]) -> list[str]:
    """Distinct paths, dropping those inside another one (one bind covers them)."""
    real = sorted({os.path.realpath(p) for p in paths})
    return [p for p in real if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in real)]


def _blocked_ancestor(path: str) -> str | None:
    """First ancestor directory that 'others' cannot traverse (e.g. a mode-700 /root), if any."""
    parts = Path(path).parts
    for i in range(2, len(parts)):
        d = str(Path(*parts[:i]))
        if not os.stat(d).st_mode & 0o001:
            return d
    return None


def _expose_to_sandbox_uid(paths: list[str]) -> list[str]:
    """Outer root-bwrap args: cover each blocked ancestor with a 0755 tmpfs holding only ``paths`` (read-only)."""
    args: list[str] = []
    blocked: dict[str, list[str]] = {}
    for p in paths:
        b = _blocked_ancestor(p)
        if b:
            blocked.setdefault(b, []).append(p)
    for b, inside in sorted(blocked.items()):
        args += ["--perms", "0755", "--tmpfs", b]
        for p in inside:
            for d in list(reversed(Path(p).parents))[len(Path(b).parts) :]:
                args += ["--perms", "0755", "--dir", str(d)]
            args += ["--ro-bind", p, p]
    return args


def build_command(
    argv: list[str],
    *,
    readonly: Sequence[str],
    env: dict[str, str],
    limits: Limits,
    containment: Containment,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The command line that runs ``argv`` under ``containment`` (bwrap, or rlimits only when unsafe)."""
    prlimit = [shutil.which("prlimit") or "prlimit", *limits.prlimit_args(), "--"]
    if not containment.contained:
        return (prlimit if shutil.which("prlimit") else []) + argv
    bwrap = str(containment.bwrap)
    uid = str(SANDBOX_UID)
    inner = [
        bwrap,
        "--unshare-user",
        "--uid",
        uid,
        "--gid",
        uid,
        "--disable-userns",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--clearenv",
    ]
    for key, value in base_env(env, home=WORK_DIR).items():
        inner += ["--setenv", key, value]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            inner += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            inner += ["--ro-bind", d, d]
    inner += [a for f in _ETC_FILES if os.path.exists(f) for a in ("--ro-bind", f, f)]
    # The sized tmpfs first, the read-only binds after: a runtime or checkout under /tmp stays visible.
    inner += ["--proc", "/proc", "--dev", "/dev", "--size", str(int(limits.disk)), "--perms", "1777"]
    inner += ["--tmpfs", WORK_DIR]
    ro = _outermost(_python_roots() + [str(Path(p).resolve()) for p in readonly])
    for p in ro:
        inner += ["--ro-bind", p, p]
    inner += ["--chdir", WORK_DIR, "--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        inner += ["--seccomp", str(seccomp_fd)]
    inner += ["--", *prlimit, *argv]
    if not containment.drop_root:
        return inner
    bwrap_home = str(Path(bwrap).resolve().parent.parent.parent)  # site-packages: bwrap + its bundled libcap
    outer = [
        bwrap,
        "--dev-bind",
        "/",
        "/",
        "--die-with-parent",
        "--unshare-pid",  # its pid 1 dies with the host process, and the whole namespace with it
        *_expose_to_sandbox_uid(_outermost(ro + [bwrap_home])),
    ]
    setpriv = [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
        "--",
    ]
    return outer + ["--", *setpriv, *inner]
