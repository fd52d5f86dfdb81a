"""Containment actually applied to generated code (whatever this host allows), and reported."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from echo_trl.envs.awm import sandbox


def _run_contained(tmp_path, code: str, **env) -> dict:
    work = tmp_path / "work"
    work.mkdir()
    os.chmod(tmp_path, 0o755)
    log = tmp_path / "log.txt"
    with open(log, "wb") as fh:
        proc = sandbox.spawn([sys.executable, "-I", "-c", textwrap.dedent(code)], cwd=str(work), writable=[str(work)],
                             env=env, stdout=fh)
    try:
        proc.wait(timeout=60)
    finally:
        sandbox.kill_tree(proc)
    assert proc.returncode == 0, log.read_text()
    return json.loads((work / "out.json").read_text())


def test_detection_reports_what_is_applied():
    c = sandbox.detect_containment()
    applied = c.applied()
    assert "rlimits (AS, FSIZE, NOFILE, CORE; CPU for verifiers)" in applied and "scrubbed environment" in applied
    assert isinstance(c.to_json()["notes"], list)


def test_generated_code_is_contained(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_should_not_leak")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    c = sandbox.detect_containment()
    out = _run_contained(tmp_path, f"""
        import json, os, resource, socket
        res = {{"env": sorted(os.environ), "uid": os.getuid()}}
        s = socket.socket(); s.settimeout(2)
        try:
            s.connect(("127.0.0.1", {port})); res["net"] = "connected"
        except OSError as e:
            res["net"] = "blocked"
        try:
            open({str(tmp_path / "outside.txt")!r}, "w").write("x"); res["fs"] = "written"
        except OSError:
            res["fs"] = "blocked"
        try:
            os.kill(1 if os.getpid() != 1 else {os.getppid()}, 0); res["see_host_pid"] = True
        except OSError:
            res["see_host_pid"] = False
        res["core"] = resource.getrlimit(resource.RLIMIT_CORE)
        json.dump(res, open("out.json", "w"))
    """)
    listener.close()
    assert "HF_TOKEN" not in out["env"] and "PATH" in out["env"]
    assert out["core"] == [0, 0]
    if c.net_namespace:
        assert out["net"] == "blocked"
    if c.readonly_fs:
        assert out["fs"] == "blocked" and not (tmp_path / "outside.txt").exists()
    if c.uid is not None:
        assert out["uid"] == c.uid


@pytest.mark.parametrize("layers", ["detected", "none"])
def test_kill_tree_reaps_the_whole_group(tmp_path, layers):
    # "none" is the path hosts without user namespaces take: no PID namespace to die with the
    # leader, so the grandchild outlives it unless kill_tree gets the whole group.
    containment = sandbox.detect_containment() if layers == "detected" else sandbox.Containment()
    work = tmp_path / "w"
    work.mkdir()
    os.chmod(tmp_path, 0o755)
    proc = sandbox.spawn([sys.executable, "-I", "-c", "import subprocess,time; subprocess.Popen(['sleep','300']); "
                          "time.sleep(300)"], cwd=str(work), writable=[str(work)], containment=containment)
    deadline = time.monotonic() + 10
    while len(sandbox.group_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # wait for the grandchild, so there is one to kill
    assert len(sandbox.group_members(proc.pid)) >= 2
    assert proc.pid in sandbox.live_children()
    sandbox.kill_tree(proc)
    assert proc.poll() is not None and proc.pid not in sandbox.live_children()
    # Independent check: whatever pgrep still lists in the group must be a zombie (dead, left
    # for init to reap; a container's init may be slow to), never a running process.
    out = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
    for pid in out.stdout.split():
        with contextlib.suppress(FileNotFoundError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            assert state in ("Z", "X"), f"pid {pid} in the killed group is still running ({state})"
    assert sandbox.group_members(proc.pid) == []


@pytest.mark.parametrize("value", ["none"])
def test_sandbox_can_be_switched_off(monkeypatch, value):
    monkeypatch.setenv("ECHO_TRL_SANDBOX", value)
    c = sandbox._detect()
    assert not c.unshare and c.uid is None and not c.readonly_fs and c.notes
