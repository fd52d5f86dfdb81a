"""A fresh session keyring for every sandbox, so generated code never holds the host's keys.

A process inherits its session keyring at fork. The host forks every sandbox from one dedicated
thread (:mod:`.bwrap`), and keyrings are per-thread credentials: that thread joins a new,
anonymous session keyring right before each fork and makes it visible to its possessor only,
so each sandbox starts with an empty keyring of its own while the host's other threads keep
theirs. Inside, the seccomp filter denies every keyring system call anyway.
"""

from __future__ import annotations

import ctypes
import os

from . import seccomp

KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_SETPERM = 5
KEY_SPEC_SESSION_KEYRING = -3
KEY_POS_ALL = 0x3F000000  # view, read, write, search, link, setattr: for the possessor only

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def join_fresh_session_keyring() -> str | None:
    """Give the calling thread a new empty session keyring; ``None`` on success, else why not."""
    nr = ctypes.c_long(seccomp.syscall_number("keyctl"))
    calls = (
        ("keyctl(JOIN_SESSION_KEYRING)", (ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_void_p(None))),
        (
            "keyctl(SETPERM)",
            (ctypes.c_long(KEYCTL_SETPERM), ctypes.c_long(KEY_SPEC_SESSION_KEYRING), ctypes.c_ulong(KEY_POS_ALL)),
        ),
    )
    for what, args in calls:
        if _libc.syscall(nr, *args) < 0:
            return f"{what}: {os.strerror(ctypes.get_errno())}"
    return None
