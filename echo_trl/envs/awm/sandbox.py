"""Containment for generated code (scenario servers and verifiers): detect, apply, report, clean up.

AWM server and verifier code is generated, arbitrary Python. It only ever runs in a child
process started here, wrapped in as much containment as the host allows, detected once per
process by probing (``detect_containment``):

==========================  ==============================================================
layer                       how / when
==========================  ==============================================================
network cut                 ``unshare --net``: a new network namespace with no interfaces
                            (servers are reached over a Unix socket, which still works)
own PID namespace           ``unshare --pid --fork --kill-child``: cannot see or signal
                            host processes; everything in it dies with it
read-only filesystem        private mount namespace; every mount read-only except the
                            episode's own temp dirs
least privilege             uid/gid 65534 when that user can run this Python; otherwise
                            root with an empty capability bounding set + no_new_privs
rlimits                     address space, CPU seconds (verifiers), file size, open files,
                            no core dumps
parent-death signal         children are SIGKILLed when the process that started them dies
                            (also on SIGKILL, where ``atexit`` cannot run)
clean environment           only PATH/LANG/TMPDIR and the variables the code needs: no Hub
                            tokens or other secrets reach generated code
==========================  ==============================================================

``ECHO_TRL_SANDBOX=none`` turns the namespace/privilege layers off (rlimits, the temp working
directory, the clean environment and the cleanup stay). Every child runs in its own process
group; :func:`kill_tree` kills the group and reaps it, and an ``atexit`` hook kills whatever is
still registered.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHER = str(Path(__file__).with_name("_launch.py"))
SANDBOX_UID = 65534  # "nobody"
_PROBE_MODULES = "import fastapi, fastapi_mcp, uvicorn, sqlalchemy, mcp"


@dataclass(frozen=True)
class Limits:
    """rlimits for one sandboxed process (``None`` = leave unlimited)."""

    address_space: int | None = 4 << 30
    cpu_seconds: int | None = None
    file_size: int | None = 1 << 30
    open_files: int | None = 1024

    def rlimits(self) -> dict[str, tuple[int, int]]:
        out = {"RLIMIT_CORE": (0, 0)}
        for name, value in (("RLIMIT_AS", self.address_space), ("RLIMIT_CPU", self.cpu_seconds),
                            ("RLIMIT_FSIZE", self.file_size), ("RLIMIT_NOFILE", self.open_files)):
            if value is not None:
                out[name] = (int(value), int(value))
        return out


SERVER_LIMITS = Limits()
VERIFIER_LIMITS = Limits(address_space=2 << 30, file_size=64 << 20, open_files=64)


@dataclass(frozen=True)
class Containment:
    """The containment layers this host allows (what every sandboxed child gets)."""

    unshare: tuple[str, ...] = ()  # flags given to unshare(1)
    readonly_fs: bool = False
    uid: int | None = None  # non-root uid the code runs as
    drop_caps: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def net_namespace(self) -> bool:
        return "--net" in self.unshare

    @property
    def pid_namespace(self) -> bool:
        return "--pid" in self.unshare

    def applied(self) -> list[str]:
        """Human-readable list of the layers in force (for logs, reports and episode metadata)."""
        out = []
        if self.net_namespace:
            out.append("network namespace (no network)")
        if self.pid_namespace:
            out.append("pid namespace")
        if self.readonly_fs:
            out.append("read-only filesystem except episode dirs")
        if self.uid is not None:
            out.append(f"uid/gid {self.uid}")
        elif self.drop_caps:
            out.append("root without capabilities (no_new_privs)")
        out += ["rlimits (AS, FSIZE, NOFILE, CORE; CPU for verifiers)", "parent-death SIGKILL",
                "private temp working dir", "scrubbed environment"]
        return out

    def to_json(self) -> dict:
        return {"applied": self.applied(), "notes": list(self.notes)}


# --------------------------------------------------------------------------------------------
# Detection


_detected: Containment | None = None
_detect_lock = threading.Lock()


def detect_containment(refresh: bool = False) -> Containment:
    """Probe (once per process) which layers work here, strongest first."""
    global _detected
    with _detect_lock:
        if _detected is None or refresh:
            _detected = _detect()
        return _detected


def _run_quiet(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 20.0) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        return p.returncode, (p.stderr or "").strip()[-500:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)


def _detect() -> Containment:
    if os.environ.get("ECHO_TRL_SANDBOX", "auto").lower() in ("none", "off", "0"):
        return Containment(notes=("ECHO_TRL_SANDBOX=none: namespaces and privilege drop disabled",))
    if not sys.platform.startswith("linux"):
        return Containment(notes=(f"{sys.platform}: only rlimits and cleanup are available",))
    notes = []
    flags: tuple[str, ...] = ()
    unshare = shutil.which("unshare")
    if unshare:
        for candidate in (("--mount", "--net", "--pid", "--fork", "--kill-child"), ("--net", "--pid", "--fork",
                          "--kill-child"), ("--net",)):
            rc, err = _run_quiet([unshare, *candidate, "true"])
            if rc == 0:
                flags = candidate
                break
            notes.append(f"unshare {' '.join(candidate)} unavailable ({err or rc})")
    else:
        notes.append("unshare(1) not found: no namespaces")
    root = os.geteuid() == 0
    options = []
    readonly_ok = "--mount" in flags
    if root:
        options += [dict(readonly_fs=readonly_ok, uid=SANDBOX_UID), dict(readonly_fs=readonly_ok, drop_caps=True)]
        if readonly_ok:
            options += [dict(readonly_fs=False, uid=SANDBOX_UID), dict(readonly_fs=False, drop_caps=True)]
    else:
        options += [dict(readonly_fs=readonly_ok)] if readonly_ok else []
    options.append({})
    with tempfile.TemporaryDirectory(prefix="echo_trl_probe_") as tmp:
        for opt in options:
            cand = Containment(unshare=flags, **opt)
            if cand.uid is not None:
                os.chown(tmp, cand.uid, cand.uid)
            cmd, env = build_command([sys.executable, "-I", "-c", _PROBE_MODULES], cwd=tmp, writable=[tmp],
                                     env={}, limits=SERVER_LIMITS, containment=cand)
            rc, err = _run_quiet(cmd, env=env, timeout=60.0)
            if rc == 0:
                return Containment(unshare=flags, notes=tuple(notes), **opt)
            notes.append(f"{', '.join(cand.applied()[:4]) or 'plain'}: probe failed ({err.splitlines()[-1] if err else rc})")
            if flags and rc == 125 and not opt:
                break
    # Namespaces themselves broke the probe: fall back to none.
    return Containment(notes=tuple(notes) + ("falling back to rlimits + cleanup only",))


# --------------------------------------------------------------------------------------------
# Commands and processes


def base_env(extra: dict[str, str] | None = None, *, home: str) -> dict[str, str]:
    """The whole environment generated code sees: nothing inherited but PATH and locale."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8"),
           "HOME": home, "TMPDIR": home, "SQLITE_TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0", "NO_PROXY": "*"}
    env.update(extra or {})
    return env


def build_command(argv: list[str], *, cwd: str, writable: list[str], env: dict[str, str], limits: Limits,
                  containment: Containment) -> tuple[list[str], dict[str, str]]:
    """(command, environment) that run ``argv`` under ``containment`` via the launcher."""
    spec = {"argv": argv, "env": base_env(env, home=cwd), "cwd": cwd,
            "writable": [str(Path(w).resolve()) for w in writable], "readonly_root": containment.readonly_fs,
            "uid": containment.uid, "gid": containment.uid, "drop_caps": containment.drop_caps,
            "rlimits": limits.rlimits(), "parent_pid": os.getpid(), "pid_namespace": containment.pid_namespace}
    cmd = [sys.executable, "-I", LAUNCHER]
    if containment.unshare:
        prefix = [shutil.which("unshare") or "unshare", *containment.unshare, "--"]
        setpriv = shutil.which("setpriv")
        if setpriv and containment.pid_namespace:
            # unshare stays as the namespace's parent: it must die with us too.
            prefix = [setpriv, "--pdeathsig", "KILL", "--", *prefix]
        cmd = prefix + cmd
    return cmd, {"ECHO_TRL_SANDBOX_SPEC": json.dumps(spec), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


# Children are started from one long-lived thread: the parent-death signal fires when the
# *thread* that forked a child exits, so a short-lived caller thread must not be that parent.
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo-trl-spawner")
_live: dict[int, subprocess.Popen] = {}
_live_lock = threading.Lock()


def spawn(argv: list[str], *, cwd: str, writable: list[str], env: dict[str, str] | None = None,
          limits: Limits = SERVER_LIMITS, containment: Containment | None = None,
          stdout=subprocess.DEVNULL) -> subprocess.Popen:
    """Start ``argv`` contained, in its own process group, registered for cleanup."""
    containment = containment or detect_containment()
    if containment.uid is not None:
        for w in writable:
            os.chown(w, containment.uid, containment.uid)
    cmd, popen_env = build_command(argv, cwd=cwd, writable=writable, env=env or {}, limits=limits,
                                   containment=containment)

    def start() -> subprocess.Popen:
        return subprocess.Popen(cmd, env=popen_env, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    proc = _spawner.submit(start).result()
    with _live_lock:
        _live[proc.pid] = proc
    return proc


def kill_tree(proc: subprocess.Popen | None, *, timeout: float = 5.0) -> None:
    """SIGKILL ``proc``'s whole process group and reap it; safe to call twice."""
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    # Grandchildren are reparented to init once the leader dies; SIGKILL is asynchronous, so
    # wait until every member of the group is gone or a zombie (dead, waiting for init to reap).
    deadline = time.monotonic() + timeout
    while group_members(proc.pid) and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.01)
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
