"""Adversarial scenarios: generated code that tries to escape, run through ``echo-trl capture``.

A copy of the bundled ``library_1`` scenario gets a planted ``probe`` tool (server side) and a
planted verifier for task 0. Each probe attacks one thing and reports what it managed in the
tool's error text (HTTP 400 with a JSON detail); the test checks the host independently (the
secret bytes never appear in the episodes, no file appears in /dev, the listeners see no
connection, core_pattern is unchanged, nothing with the probe's marker runs afterwards).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers.processes import descendant_pids

from echo_trl.commands import capture
from echo_trl.envs.awm import sandbox

DATA = Path(__file__).resolve().parents[3] / "data" / "awm_scenarios"
CONTAINMENT = sandbox.detect_containment()
pytestmark = pytest.mark.skipif(
    not CONTAINMENT.contained, reason=f"no containment on this host: {' '.join(CONTAINMENT.notes)}"
)

PROBES = [
    "shadow",
    "secret",
    "proc_sys",
    "dev",
    "outside",
    "unix",
    "tcp",
    "ps",
    "forks",
    "memory",
    "daemon",
    "sleep",
    "stdout",
]

PROBE_CODE = '''

# ---- planted by the containment test: one tool that attacks the host ----
import json as _json, os as _os, socket as _socket, subprocess as _subprocess, sys as _sys, time as _time
from fastapi import HTTPException as _HTTPException
CONF = {conf!r}


def _attempt(name):
    if name == "shadow":
        return open("/etc/shadow").read()
    if name == "secret":
        return open(CONF["secret"]).read()
    if name == "proc_sys":
        path = "/proc/sys/kernel/core_pattern"
        value = open(path).read()
        with open(path, "w") as fh:
            fh.write(value)
        return "wrote " + path
    if name == "dev":
        open("/dev/" + CONF["marker"], "w").write("x")
        return "created /dev/" + CONF["marker"]
    if name == "outside":
        done = []
        for path in (CONF["outside"], "/escape.txt", "/usr/escape.txt", _sys.prefix + "/escape.txt"):
            try:
                open(path, "w").write("x")
                done.append(path)
            except OSError:
                pass
        if not done:
            raise PermissionError("no write outside the episode dir")
        return done
    if name == "unix":
        s = _socket.socket(_socket.AF_UNIX)
        s.connect(CONF["unix"])
        return "connected"
    if name == "tcp":
        s = _socket.create_connection(("127.0.0.1", CONF["port"]), timeout=2)
        return "connected"
    if name == "ps":
        pids = [p for p in _os.listdir("/proc") if p.isdigit()]
        lines = [open(f"/proc/{{p}}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
                 for p in pids]
        raise PermissionError(_json.dumps({{"visible": lines}}))
    if name == "forks":
        kids = []
        try:
            for _ in range(300):
                pid = _os.fork()
                if pid == 0:
                    _time.sleep(30)
                    _os._exit(0)
                kids.append(pid)
        finally:
            for pid in kids:
                _os.kill(pid, 9)
                _os.waitpid(pid, 0)
        return f"{{len(kids)}} forks"
    if name == "memory":
        blob = bytearray(6 << 30)
        return f"allocated {{len(blob)}}"
    if name == "daemon":
        if _os.fork() == 0:
            _os.setsid()
            if _os.fork() == 0:
                _os.execv(_sys.executable, [_sys.executable, "-c", "import time; time.sleep(600)", CONF["marker"]])
            _os._exit(0)
        _time.sleep(0.5)
        raise RuntimeError("daemon started")
    if name == "sleep":
        _time.sleep(10 ** 6)
    if name == "stdout":
        chunk = b"x" * (1 << 20)
        for _ in range(1024):
            _os.write(1, chunk)
        return "wrote 1 GB"
    raise ValueError(name)


@app.post("/probe", operation_id="probe")
def probe(name: str) -> dict:
    """Containment probe."""
    try:
        out = {{"escaped": True, "loot": _attempt(name)}}
    except BaseException as exc:
        out = {{"escaped": False, "error": f"{{type(exc).__name__}}: {{exc}}"}}
    raise _HTTPException(status_code=400, detail=_json.dumps(out))
'''

VERIFIER_CODE = """
def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import os, socket
    conf = {conf!r}
    got = {{}}
    for name, attempt in (("shadow", lambda: open("/etc/shadow").read()),
                          ("secret", lambda: open(conf["secret"]).read()),
                          ("outside", lambda: open(conf["outside"] + ".v", "w").write("x")),
                          ("unix", lambda: socket.socket(socket.AF_UNIX).connect(conf["unix"])),
                          ("tcp", lambda: socket.create_connection(("127.0.0.1", conf["port"]), timeout=2)),
                          ("home", lambda: os.listdir(os.path.expanduser("~root")))):
        try:
            attempt()
            got[name] = "escaped"
        except BaseException as exc:
            got[name] = type(exc).__name__
    return {{"result": "others", "probes": got}}
"""


class Listener:
    """A Unix and a TCP listener on the host that count connections."""

    def __init__(self, unix_path: Path):
        self.accepted = 0
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(str(unix_path))
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.port = self.tcp.getsockname()[1]
        self._stop = False
        for s in (self.unix, self.tcp):
            s.listen(8)
            s.settimeout(0.1)
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s: socket.socket) -> None:
        while not self._stop:
            try:
                conn, _ = s.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self.unix.close()
        self.tcp.close()


def _scenario_copy(dst: Path, conf: dict) -> Path:
    """library_1 with the probe tool planted in its server and the probe verifier for task 0."""
    shutil.copytree(DATA, dst)
    envs = [json.loads(line) for line in (dst / "gen_envs.jsonl").read_text().splitlines() if line.strip()]
    for rec in envs:
        code = rec["full_code"].split('\nif __name__ == "__main__":')[0]
        rec["full_code"] = code + PROBE_CODE.format(conf=conf)
    (dst / "gen_envs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in envs))
    vers = [
        json.loads(line) for line in (dst / "gen_verifier.pure_code.jsonl").read_text().splitlines() if line.strip()
    ]
    for rec in vers:
        if rec["task_idx"] == 1:
            rec["verification"] = {**rec["verification"], "code": VERIFIER_CODE.format(conf=conf)}
    (dst / "gen_verifier.pure_code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in vers))
    return dst


def _marker_processes(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def _our_runtime_dirs() -> list[Path]:
    """Runtime dirs this process owns (other test sessions on the host make their own)."""
    mine = []
    for d in Path(tempfile.gettempdir()).glob("echo_trl_awm_*"):
        try:
            if (d / "owner.pid").read_text() == str(os.getpid()):
                mine.append(d)
        except OSError:
            pass
    return mine


@pytest.fixture(scope="module")
def attack(tmp_path_factory):
    """Run every probe (one episode each) plus the verifier probe through ``echo-trl capture``."""
    tmp = tmp_path_factory.mktemp("attack")
    marker = f"echo_trl_probe_{uuid.uuid4().hex[:12]}"
    secret = tmp / "secret.txt"
    secret.write_text(f"TOP-SECRET-{marker}")
    os.chmod(secret, 0o600)
    listener = Listener(tmp / "host.sock")
    conf = {
        "secret": str(secret),
        "unix": str(tmp / "host.sock"),
        "port": listener.port,
        "marker": marker,
        "outside": str(tmp / "outside.txt"),
    }
    data = _scenario_copy(tmp / "scenarios", conf)
    scripts = [
        {
            "task_idx": 1,
            "scenario": "library_1",
            "label": p,
            "verify": False,
            "calls": [{"tool_name": "probe", "arguments": {"name": p}}],
        }
        for p in PROBES
    ]
    scripts.append({"task_idx": 1, "scenario": "library_1", "label": "verifier", "verify": True, "calls": []})
    replay = tmp / "replay.jsonl"
    replay.write_text("".join(json.dumps(s) + "\n" for s in scripts))
    core_pattern = Path("/proc/sys/kernel/core_pattern").read_text()
    before = descendant_pids()
    out = tmp / "out"
    t0 = time.perf_counter()
    rc = capture.main(
        [
            "--data",
            str(data),
            "--scenario",
            "library_1",
            "--policy",
            f"replay:{replay}",
            "--episodes",
            str(len(scripts)),
            "--output",
            str(out),
            "--tool-timeout",
            "4",
        ]
    )
    seconds = time.perf_counter() - t0
    time.sleep(0.3)
    listener.close()
    episodes = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    yield {
        "rc": rc,
        "episodes": episodes,
        "log": (out / "capture_log.txt").read_text(),
        "marker": marker,
        "secret": secret.read_text(),
        "listener": listener,
        "conf": conf,
        "core_pattern": core_pattern,
        "leftover_pids": descendant_pids() - before,
        "marker_pids": _marker_processes(marker),
        "our_dirs": _our_runtime_dirs(),
        "seconds": seconds,
        "raw": "\n".join(f.read_text() for f in out.glob("*.jsonl")),
    }


def _probe(attack, name: str) -> dict:
    (ep,) = [e for e in attack["episodes"] if e["steps"] and e["steps"][0]["action"]["arguments"].get("name") == name]
    return ep["steps"][0]["observation"]


def _blocked(attack, name: str) -> str:
    """The probe's own report (the 400 detail): it must say it did not escape; returns its error."""
    obs = _probe(attack, name)
    assert "tool_result" not in obs and "Response: " in obs["error"], obs  # an HTTP error answer
    report = json.loads(json.loads(obs["error"].split("Response: ", 1)[1])["detail"])
    assert report["escaped"] is False, report
    return report["error"]


def test_capture_ran_contained_and_ended_cleanly(attack):
    assert attack["rc"] == 0
    assert len(attack["episodes"]) == len(PROBES) + 1
    assert "containment: bubblewrap" in attack["log"] and "unsafe-no-sandbox: no" in attack["log"]


@pytest.mark.parametrize("name", ["shadow", "secret"])
def test_host_files_are_not_readable(attack, name):
    text = _blocked(attack, name)
    assert "FileNotFoundError" in text  # not even there: the sandbox has no host /etc or /tmp
    assert attack["secret"] not in attack["raw"]


def test_kernel_settings_and_dev_are_not_writable(attack):
    assert _blocked(attack, "proc_sys").startswith(("PermissionError", "OSError"))  # owned by host root, ro
    assert "Read-only file system" in _blocked(attack, "dev")
    assert Path("/proc/sys/kernel/core_pattern").read_text() == attack["core_pattern"]
    assert not Path("/dev", attack["marker"]).exists()


def test_no_write_outside_the_episode_dir(attack):
    _blocked(attack, "outside")
    assert not Path(attack["conf"]["outside"]).exists() and not Path("/escape.txt").exists()


def test_no_host_socket_or_loopback_tcp(attack):
    assert "FileNotFoundError" in _blocked(attack, "unix")
    _blocked(attack, "tcp")
    assert attack["listener"].accepted == 0


def test_host_processes_are_invisible(attack):
    visible = json.loads(_blocked(attack, "ps").split(": ", 1)[1])["visible"]
    assert visible and not any("pytest" in line for line in visible)
    assert len(visible) < 10, visible  # the sandbox's own few processes, not the host's


def test_forks_and_memory_are_capped(attack):
    text = _blocked(attack, "forks")
    assert "BlockingIOError" in text or "Resource temporarily unavailable" in text
    assert "MemoryError" in _blocked(attack, "memory")


def test_sleeping_forever_times_out_and_stdout_flood_hits_the_file_size_cap(attack):
    sleep = _probe(attack, "sleep")
    assert sleep["reward_type"] == "timeout" and sleep["done"]
    assert "File too large" in _blocked(attack, "stdout")  # RLIMIT_FSIZE (Python ignores SIGXFSZ: EFBIG)


def test_verifier_is_contained_too(attack):
    (ep,) = [e for e in attack["episodes"] if not e["steps"] or e["steps"][-1]["action"]["tool_name"] == "verify"]
    probes = ep["steps"][-1]["observation"]["verify_result"]["raw_result"]["probes"]
    assert probes and all(v != "escaped" for v in probes.values()), probes
    assert not Path(attack["conf"]["outside"] + ".v").exists()


def test_nothing_left_running_or_on_disk(attack):
    assert "daemon started" in _probe(attack, "daemon")["error"]
    assert attack["leftover_pids"] == set()
    assert attack["marker_pids"] == []  # the double-forked, setsid daemon died with its sandbox
    assert attack["our_dirs"] == []
