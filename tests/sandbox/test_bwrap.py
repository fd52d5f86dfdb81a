"""The bwrap sandbox itself: what generated code sees, refusal without containment, cleanup."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from echo_trl.commands.cli import main as cli_main
from echo_trl.envs.awm.runtime.episode import AWMRuntime
from echo_trl.envs.awm.scenario.source import ScenarioSource
from echo_trl.sandbox import bwrap as sandbox
from echo_trl.sandbox import seccomp

DATA = Path(__file__).resolve().parents[2] / "data" / "awm_scenarios"
CONTAINMENT = sandbox.detect_containment()
needs_bwrap = pytest.mark.skipif(
    not CONTAINMENT.contained, reason=f"no containment on this host: {' '.join(CONTAINMENT.notes)}"
)


def _run(code: str, containment: sandbox.Containment, **env) -> dict:
    """Run ``code`` contained; it prints one JSON object as its last stdout line (a pipe: no host file)."""
    proc = sandbox.spawn(
        [sys.executable, "-I", "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE, containment=containment
    )
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        sandbox.kill_tree(proc)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    return json.loads(text.strip().splitlines()[-1])


@needs_bwrap
def test_generated_code_sees_only_the_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_should_not_leak")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    out = _run(
        f"""
        import json, os, resource, socket
        res = {{"env": sorted(os.environ), "uid": os.getuid(), "gid": os.getgid(), "root": sorted(os.listdir("/")),
                "tmp": os.listdir("/tmp"), "pids": [p for p in os.listdir("/proc") if p.isdigit()],
                "status": open("/proc/self/status").read(),
                "limits": {{k: resource.getrlimit(getattr(resource, k)) for k in
                           ("RLIMIT_CORE", "RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CPU")}}}}
        s = socket.socket(); s.settimeout(2)
        try:
            s.connect(("127.0.0.1", {port})); res["net"] = "connected"
        except OSError:
            res["net"] = "blocked"
        for name, path in (("outside", {str(tmp_path / "outside.txt")!r}), ("usr", "/usr/x"), ("tmp", "/tmp/x")):
            try:
                open(path, "w").write("x"); res[name] = "written"
            except OSError as e:
                res[name] = type(e).__name__
        res["cwd"] = os.getcwd()
        print(json.dumps(res))
    """,
        CONTAINMENT,
    )
    listener.close()
    assert "HF_TOKEN" not in out["env"] and "PATH" in out["env"]
    assert out["uid"] == out["gid"] == sandbox.SANDBOX_UID
    assert "CapEff:\t0000000000000000" in out["status"] and "NoNewPrivs:\t1" in out["status"]
    assert out["net"] == "blocked"
    # the host's tmp_path is not in there (its /tmp is the sandbox's own tmpfs): nothing lands on the host
    assert not (tmp_path / "outside.txt").exists() and out["outside"] == "FileNotFoundError"
    assert out["usr"] in ("OSError", "PermissionError") and out["tmp"] == "written"  # private /tmp
    assert out["cwd"] == sandbox.WORK_DIR
    allowed = {
        "bin",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "sbin",
        "tmp",
        "usr",
        *(Path(p).parts[1] for p in (sys.base_prefix, sys.prefix)),
    }
    assert set(out["root"]) <= allowed and "home" not in out["root"] and "run" not in out["root"]
    assert len(out["pids"]) < 5  # its own pid namespace
    limits = sandbox.SERVER_LIMITS
    assert out["limits"]["RLIMIT_CORE"] == [0, 0]
    assert (
        out["limits"]["RLIMIT_AS"][0] == limits.address_space and out["limits"]["RLIMIT_NPROC"][0] == limits.processes
    )
    assert (
        out["limits"]["RLIMIT_FSIZE"][0] == limits.file_size and out["limits"]["RLIMIT_CPU"][0] == limits.cpu_seconds
    )


@needs_bwrap
def test_command_binds_nothing_writable_and_nothing_of_the_hosts_tmp_run_or_home(tmp_path):
    script = tmp_path / "bootstrap.py"
    script.write_text("pass")
    cmd = sandbox.build_command(
        ["true"], readonly=[str(script)], env={}, limits=sandbox.SERVER_LIMITS, containment=CONTAINMENT, seccomp_fd=9
    )
    inner = cmd[cmd.index("--unshare-user") :]
    sources = {inner[i + 1] for i, a in enumerate(inner) if a in ("--bind", "--ro-bind", "--dev-bind")}
    assert "--bind" not in inner and "--dev-bind" not in inner  # no host directory is writable inside
    assert str(script) in sources and "/tmp" not in sources and "/run" not in sources and "/" not in sources
    assert not any(s.startswith(("/home", "/run", "/var")) for s in sources)
    assert {"--unshare-pid", "--unshare-net", "--die-with-parent", "--clearenv", "--disable-userns"} <= set(inner)
    size = inner.index("--size")  # the one writable dir: a tmpfs of its own, sized
    assert inner[size + 1] == str(sandbox.SERVER_LIMITS.disk) and inner[size + 4 : size + 6] == ["--tmpfs", "/tmp"]
    assert inner.index("--tmpfs") < inner.index(str(script))  # binds after the tmpfs: visible under /tmp too
    assert inner[inner.index("--seccomp") + 1] == "9"
    if CONTAINMENT.drop_root:  # the outer, root bwrap: a pid namespace that dies with us
        outer = cmd[: cmd.index("--")]
        assert "--unshare-pid" in outer and "--die-with-parent" in outer


def test_limits_become_prlimit_arguments():
    args = sandbox.Limits(
        address_space=1 << 30, cpu_seconds=5, file_size=None, open_files=8, processes=4
    ).prlimit_args()
    assert args == ["--core=0", f"--as={1 << 30}", "--cpu=5", "--nofile=8", "--nproc=4"]


def test_missing_bwrap_is_refused_with_one_clear_error(monkeypatch, tmp_path):
    missing = tmp_path / "no-such-bwrap"
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(missing))
    monkeypatch.setattr(sandbox, "_detected", None)
    try:
        with pytest.raises(sandbox.ContainmentUnavailable) as err:
            sandbox.require_containment()
        msg = str(err.value)
        assert str(missing) in msg and "--unsafe-no-sandbox" in msg and "\n" not in msg
        with pytest.raises(sandbox.ContainmentUnavailable):
            AWMRuntime(ScenarioSource.from_dir(DATA).load("library_1"))
        assert sandbox.require_containment(unsafe_no_sandbox=True) is sandbox.UNSAFE
    finally:
        monkeypatch.undo()
        sandbox.detect_containment(refresh=True)


def test_capture_refuses_without_containment_and_runs_with_explicit_unsafe(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(sandbox.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    monkeypatch.setattr(sandbox, "_detected", None)
    replay = tmp_path / "replay.jsonl"
    replay.write_text(
        json.dumps(
            {
                "task_idx": 0,
                "scenario": "library_1",
                "verify": False,
                "calls": [{"tool_name": "get_member", "arguments": {"member_id": 1}}],
            }
        )
        + "\n"
    )
    base = ["capture", "--data", str(DATA), "--scenario", "library_1", "--policy", f"replay:{replay}"]
    try:
        assert cli_main([*base, "--output", str(tmp_path / "refused")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "refusing to run generated AWM code uncontained" in err[0]
        assert "no-such-bwrap" in err[0] and not (tmp_path / "refused" / "library_1_task0.jsonl").exists()
        assert cli_main([*base, "--output", str(tmp_path / "unsafe"), "--unsafe-no-sandbox"]) == 0
    finally:
        monkeypatch.undo()
        sandbox.detect_containment(refresh=True)
    log = (tmp_path / "unsafe" / "capture_log.txt").read_text()
    assert "unsafe-no-sandbox: yes" in log and "containment: NONE" in log
    record = json.loads((tmp_path / "unsafe" / "library_1_task0.jsonl").read_text())
    assert record["metadata"]["containment"][0].startswith("NONE")
    assert record["steps"][0]["observation"]["reward_type"] == "tool_call_ok"


@pytest.mark.parametrize("layers", ["contained", "unsafe"])
def test_kill_tree_reaps_everything(tmp_path, layers):
    if layers == "contained" and not CONTAINMENT.contained:
        pytest.skip(f"no containment on this host: {' '.join(CONTAINMENT.notes)}")
    containment = CONTAINMENT if layers == "contained" else sandbox.UNSAFE
    proc = sandbox.spawn(
        [sys.executable, "-I", "-c", "import subprocess,time; subprocess.Popen(['sleep','300']); time.sleep(300)"],
        containment=containment,
    )
    deadline = time.monotonic() + 10
    sleeping = []
    while not sleeping and time.monotonic() < deadline:
        time.sleep(0.05)  # wait for the grandchild, so there is one to kill
        out = subprocess.run(["pgrep", "-x", "sleep", "-g", str(proc.pid)], capture_output=True, text=True)
        sleeping = out.stdout.split()
    assert sleeping and proc.pid in sandbox.live_children()
    sandbox.kill_tree(proc)
    assert proc.poll() is not None and proc.pid not in sandbox.live_children()
    for pid in sleeping:  # independent check: the grandchild is gone or a zombie
        with contextlib.suppress(FileNotFoundError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            assert state in ("Z", "X"), f"pid {pid} is still running ({state})"
    assert sandbox.group_members(proc.pid) == []


def test_uncontained_run_still_gets_a_clean_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_should_not_leak")
    out = _run(
        """
        import json, os, resource
        print(json.dumps({"env": sorted(os.environ), "core": resource.getrlimit(resource.RLIMIT_CORE)}))
    """,
        sandbox.UNSAFE,
    )
    assert "HF_TOKEN" not in out["env"] and out["core"] == [0, 0]
    assert sandbox.UNSAFE.applied()[0].startswith("NONE")


@needs_bwrap
def test_session_memory_cap_covers_all_processes_together(tmp_path):
    """Three processes of 120 MB each: fine per process (AS 1 GB), over a 256 MB session cap."""
    if not CONTAINMENT.session.version:
        pytest.skip(f"no cgroup for session caps here: {CONTAINMENT.session.reason}")
    limits = sandbox.Limits(address_space=1 << 30, session_memory=256 << 20, processes=64)
    code = textwrap.dedent("""
        import json, os, time
        kids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                blob = b"\\x01" * (120 << 20)
                time.sleep(2)
                os._exit(0)
            kids.append(pid)
        print(json.dumps([os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]))
    """)
    proc = sandbox.spawn(
        [sys.executable, "-I", "-c", code], limits=limits, containment=CONTAINMENT, stdout=subprocess.PIPE
    )
    groups = list(proc.cgroups)
    assert groups and all((g / "cgroup.procs").exists() for g in groups)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        sandbox.kill_tree(proc)
    codes = json.loads(out.decode().strip().splitlines()[-1])
    assert -9 in codes and 0 in codes, codes  # the OOM killer took one, within the sandbox's cgroup
    assert not any(g.exists() for g in groups)  # removed with the sandbox


# --------------------------------------------------------------------------------------------
# The seccomp filter, evaluated on every system call number of both architectures


def _syscall_numbers():
    """An independent source of system-call numbers: libseccomp, else the kernel headers (skip without either)."""
    import ctypes
    import re

    try:
        lib = ctypes.CDLL("libseccomp.so.2")
        resolve = lib.seccomp_syscall_resolve_name_arch
        resolve.restype, resolve.argtypes = ctypes.c_int, [ctypes.c_uint32, ctypes.c_char_p]
        return "libseccomp", lambda arch, name: resolve(seccomp.AUDIT_ARCH[arch], name.encode())
    except OSError:
        pass
    headers = {
        "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        "aarch64": Path("/usr/include/asm-generic/unistd.h"),
    }
    if not all(p.exists() for p in headers.values()):
        pytest.skip("neither libseccomp nor the kernel's unistd headers are here to check the numbers against")
    tables = {
        arch: {m[0]: int(m[1]) for m in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", p.read_text())}
        for arch, p in headers.items()
    }
    return "kernel headers", lambda arch, name: tables[arch].get(name, -1)


# What the filter must deny (the threat model's list), by name: numbers come from elsewhere.
MUST_DENY = (
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "bpf",
    "perf_event_open",
    "unshare",
    "setns",
    "mount",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
)
#: Calls newer than the libseccomp / kernel headers of many hosts: (x86_64, aarch64) numbers as in the kernel's
#: arch/x86/entry/syscalls/syscall_64.tbl and scripts/syscall.tbl (statmount/listmount: 6.8, open_tree_attr: 6.15).
NEWER_THAN_LIBSECCOMP = {"statmount": (457, 457), "listmount": (458, 458), "open_tree_attr": (467, 467)}
MUST_ALLOW = (
    "read",
    "write",
    "openat",
    "close",
    "mmap",
    "munmap",
    "brk",
    "futex",
    "clone",
    "socket",
    "connect",
    "accept4",
    "bind",
    "listen",
    "sendto",
    "recvfrom",
    "execve",
    "exit_group",
    "wait4",
    "kill",
    "getpid",
    "fcntl",
    "ioctl",
    "lseek",
    "pread64",
    "pwrite64",
    "fstat",
    "newfstatat",
    "getdents64",
    "rt_sigaction",
    "rt_sigprocmask",
    "epoll_create1",
    "epoll_ctl",
    "epoll_pwait",
    "memfd_create",
    "prlimit64",
    "getrandom",
)


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_seccomp_filter_denies_exactly_the_listed_calls_with_eperm(arch):
    import errno

    source, number = _syscall_numbers()
    program = seccomp.program(arch)
    native = seccomp.AUDIT_ARCH[arch]
    eperm, enosys = seccomp.RET_ERRNO | errno.EPERM, seccomp.RET_ERRNO | errno.ENOSYS
    for name in [*MUST_DENY, *seccomp.DENIED]:
        nr = number(arch, name)
        if nr < 0 and name in NEWER_THAN_LIBSECCOMP:
            nr, source = NEWER_THAN_LIBSECCOMP[name][arch == "aarch64"], "the kernel's syscall tables"
        if name == "modify_ldt" and arch == "aarch64":
            assert nr < 0  # x86 only
            continue
        assert nr >= 0, f"{source} does not know {name} on {arch}"
        assert seccomp.evaluate(program, nr, native) == eperm, (arch, name, nr)
    socket, personality = number(arch, "socket"), number(arch, "personality")
    for family in (1, 2, 10):  # AF_UNIX, AF_INET, AF_INET6
        assert seccomp.evaluate(program, socket, native, arg0=family) == seccomp.RET_ALLOW, family
    for family in (16, 17, 40, 3, 0, 255):  # AF_NETLINK, AF_PACKET, AF_VSOCK, AF_AX25, AF_UNSPEC, junk
        assert seccomp.evaluate(program, socket, native, arg0=family) == seccomp.RET_ERRNO | errno.EAFNOSUPPORT
    for persona in (0, 0xFFFFFFFF):  # the default persona, and the query
        assert seccomp.evaluate(program, personality, native, arg0=persona) == seccomp.RET_ALLOW, persona
    for persona in (0x0008, 0x0040000, 0x0400000):  # PER_LINUX32, ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC
        assert seccomp.evaluate(program, personality, native, arg0=persona) == eperm, persona
    for name in MUST_ALLOW:
        nr = number(arch, name)
        if nr >= 0:  # e.g. aarch64 has no open/epoll_wait, only the *at / p* forms
            arg0 = 2 if name == "socket" else 0  # AF_INET (the family is checked below)
            assert seccomp.evaluate(program, nr, native, arg0=arg0) == seccomp.RET_ALLOW, (arch, name, nr)
    clone = number(arch, "clone")
    assert seccomp.evaluate(program, clone, native, arg0=0x01200011) == seccomp.RET_ALLOW  # glibc's fork flags
    for flag in (0x80, 0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert seccomp.evaluate(program, clone, native, arg0=flag | 17) == eperm, hex(flag)  # CLONE_NEW*
    assert seccomp.evaluate(program, number(arch, "clone3"), native) == enosys  # libc falls back to clone
    foreign = 0x40000003 if arch == "x86_64" else 0x40000028  # i386 / arm: other numbers, denied whole
    assert seccomp.evaluate(program, number(arch, "read"), foreign) == eperm
    if arch == "x86_64":
        assert seccomp.evaluate(program, 0x40000000 | number(arch, "read"), native) == eperm  # x32
    assert len(seccomp.program_bytes(arch)) == 8 * len(program)


def test_the_seccomp_filter_holds_in_a_real_sandbox():
    if not CONTAINMENT.contained:
        pytest.skip(f"no containment on this host: {' '.join(CONTAINMENT.notes)}")
    import errno

    names = ("unshare", "keyctl", "socket", "personality", "open_tree_attr", "kcmp", "pidfd_getfd")
    nr = {name: seccomp.syscall_number(name) for name in names}
    out = _run(
        f"""
        import ctypes, json, os
        libc = ctypes.CDLL(None, use_errno=True)
        def call(nr, *args):
            r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
            return r if r >= 0 else -ctypes.get_errno()
        sock = lambda family, kind=1: call({nr["socket"]}, family, kind, 0)
        print(json.dumps({{"unshare": call({nr["unshare"]}, 0), "keyctl": call({nr["keyctl"]}, 0, -3, 0),
                          "keys": open("/proc/keys").read(),
                          "inet": sock(2), "inet6": sock(10), "unix": sock(1),
                          "vsock": sock(40), "netlink": sock(16, 3), "packet": sock(17, 3),
                          "persona_query": call({nr["personality"]}, 0xFFFFFFFF),
                          "persona_linux32": call({nr["personality"]}, 8),
                          "open_tree_attr": call({nr["open_tree_attr"]}, -100, 0, 0, 0, 0),
                          "kcmp": call({nr["kcmp"]}, os.getpid(), os.getpid(), 0, 0, 0),
                          "pidfd_getfd": call({nr["pidfd_getfd"]}, -1, 0, 0)}}))
        """,
        CONTAINMENT,
    )
    assert out["unshare"] == out["keyctl"] == -errno.EPERM  # without the filter both succeed
    assert out["keys"] == ""  # a fresh session keyring, nobody's keys in sight
    assert min(out["inet"], out["inet6"], out["unix"]) >= 0, out  # the families code needs
    assert out["vsock"] == out["netlink"] == out["packet"] == -errno.EAFNOSUPPORT, out
    assert out["persona_query"] >= 0 and out["persona_linux32"] == -errno.EPERM, out
    assert out["open_tree_attr"] == out["kcmp"] == out["pidfd_getfd"] == -errno.EPERM, out


def test_refusal_names_the_missing_piece_before_any_way_around_it(monkeypatch):
    """bwrap works but the Python runtime cannot run inside: the error says exactly that, and the unsafe
    switch comes only as a caveat at the end (it used to read 'cannot create its sandbox', then suggest it)."""
    if not CONTAINMENT.contained:
        pytest.skip(f"no containment on this host: {' '.join(CONTAINMENT.notes)}")
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python3")
    monkeypatch.setattr(sandbox, "_detected", None)
    try:
        with pytest.raises(sandbox.ContainmentUnavailable) as err:
            sandbox.require_containment()
    finally:
        monkeypatch.undo()
        sandbox.detect_containment(refresh=True)
    msg = str(err.value)
    assert "\n" not in msg and "/nonexistent/bin/python3" in msg and "bwrap works here" in msg
    assert "user namespaces" not in msg  # not the wrong diagnosis
    fix, caveat = msg.split(" (--unsafe-no-sandbox", 1)
    assert "unsafe" not in fix and "only for code you trust" in caveat


def test_a_python_at_the_top_of_the_tree_never_binds_the_hosts_root(monkeypatch):
    from echo_trl.sandbox import bwrap_args

    monkeypatch.setattr(sys, "executable", "/python3")  # dirname(dirname(...)) is "/"
    assert "/" not in bwrap_args._python_roots()
