"""Sandbox launcher: the first program inside the sandbox; sets it up, then execs the target.

Standard library only, run as ``python -I _launch.py`` (never imported by echo_trl). Reads a
JSON spec from ``$ECHO_TRL_SANDBOX_SPEC`` and, in this order: makes the filesystem read-only
except the listed writable directories (only inside a private mount namespace), applies
rlimits, changes directory, drops privileges (to a non-root uid, or else to a capability-less
root with no_new_privs), arms the parent-death signal, and execs ``argv`` with ``env``.
Exit status 125 means the sandbox itself could not be set up (the message says which step).
"""

import ctypes
import json
import os
import resource
import signal
import sys

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SKIP_PREFIXES = ("/proc", "/sys", "/dev/pts")


def _fail(step, exc):
    sys.stderr.write(f"echo-trl sandbox: {step} failed: {exc}\n")
    sys.stderr.flush()
    os._exit(125)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc, src, target, flags):
    rc = libc.mount(src.encode() if src else None, target.encode(), None, ctypes.c_ulong(flags), None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _mount_points():
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            target = line.split()[4].encode().decode("unicode_escape")
            points.append(target)
    return points


def readonly_filesystem(writable):
    libc = _libc()
    _mount(libc, None, "/", MS_REC | MS_PRIVATE)
    for d in writable:
        _mount(libc, d, d, MS_BIND | MS_REC)
    keep = set(writable)
    for target in _mount_points():
        if target in keep or target.startswith(SKIP_PREFIXES) or target == "/dev":
            continue
        try:
            _mount(libc, None, target, MS_REMOUNT | MS_BIND | MS_RDONLY)
        except OSError:
            if target == "/":
                raise


def drop_privileges(spec):
    libc = _libc()
    if spec.get("uid") is not None:
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
    elif spec.get("drop_caps"):
        cap = 0
        while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
            cap += 1
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")


def main():
    try:
        spec = json.loads(os.environ.pop("ECHO_TRL_SANDBOX_SPEC"))
    except (KeyError, ValueError) as exc:
        _fail("reading the spec", exc)
    if spec.get("readonly_root"):
        try:
            readonly_filesystem(spec.get("writable", []))
        except OSError as exc:
            _fail("read-only filesystem", exc)
    for name, (soft, hard) in spec.get("rlimits", {}).items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError, AttributeError) as exc:
            _fail(f"setrlimit {name}", exc)
    try:
        os.chdir(spec["cwd"])
    except OSError as exc:
        _fail("chdir", exc)
    try:
        drop_privileges(spec)
    except OSError as exc:
        _fail("dropping privileges", exc)
    # After any credential change: die with whoever started us (uid changes clear this flag).
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if spec.get("parent_pid") and os.getppid() != spec["parent_pid"] and not spec.get("pid_namespace"):
        os._exit(125)  # the parent is already gone
    try:
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as exc:
        _fail(f"exec {spec['argv'][0]}", exc)


if __name__ == "__main__":
    main()
