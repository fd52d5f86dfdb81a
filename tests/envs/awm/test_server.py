"""ScenarioServer when its Unix socket path is already taken (environment containment and faults).

A stale file, the dead socket of a SIGKILLed server, or another process's listener at
``server_dir/mcp.sock``: the server takes the path over and serves real tool calls, or fails with
a clear ScenarioError in bounded time; it never reports "ready" because a foreign listener
answered. Every test checks that no child process (and, where it makes any, no temp dir) is left.
Uses the repo's own scenario (data/awm_scenarios, library_1), so nothing here needs ../shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.processes import descendant_pids

from echo_trl.envs.awm import sandbox
from echo_trl.envs.awm.database import build_database
from echo_trl.envs.awm.episode import AWMRuntime
from echo_trl.envs.awm.mcp_client import MCPSession
from echo_trl.envs.awm.scenario import Scenario, ScenarioError, ScenarioSource
from echo_trl.envs.awm.server import ScenarioServer

DATA = Path(__file__).resolve().parents[3] / "data" / "awm_scenarios"
SCENARIO = "library_1"


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return ScenarioSource.from_dir(DATA).load(SCENARIO)


@pytest.fixture(scope="module")
def expected_tools() -> set[str]:
    """The tool names the API spec declares (MCP tool name = operation_id), read without any server."""
    for line in (DATA / "gen_spec.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["scenario"] == SCENARIO:
            return {e["operation_id"] for g in rec["api_spec"]["api_groups"] for e in g["endpoints"]}
    raise AssertionError(f"{SCENARIO} not in gen_spec.jsonl")


@contextlib.contextmanager
def no_leftover_children() -> Iterator[None]:
    before = descendant_pids()
    yield
    deadline = time.monotonic() + 5
    while descendant_pids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    leftover = descendant_pids() - before
    assert not leftover, [Path(f"/proc/{p}/cmdline").read_bytes() for p in leftover]


@pytest.fixture
def server_dir(scenario: Scenario) -> Iterator[Path]:
    """``root/server`` with a built database, as AWMRuntime lays it out; root is removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="echo_trl_srv_"))
    os.chmod(root, 0o755)  # a sandbox uid must reach server/
    (root / "server").mkdir()
    build_database(scenario, root / "server" / "live.db")
    yield root / "server"
    shutil.rmtree(root, ignore_errors=True)


class Listener:
    """A foreign Unix-socket listener that accepts and never answers (counts the connections it got)."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.accepted.append(self.sock.accept()[0])

    def close(self) -> None:
        for s in [*self.accepted, self.sock]:
            s.close()


def branch_names(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as c:
        return [r[0] for r in c.execute("select name from branches")]


def assert_serves_the_scenario(socket_path: str, alive, db: Path, expected_tools: set[str]) -> None:
    """Our server answers: its MCP tools are the spec's, and a tool returns rows from the episode database."""
    with MCPSession(socket_path, timeout=20, alive=alive) as session:
        assert {t["name"] for t in session.list_tools()} == expected_tools
        out = session.call_tool("list_branches", {})
    names = branch_names(db)
    assert not out.is_error and names and all(n in out.text for n in names), out.text[:300]


@pytest.mark.parametrize("squatter", ["regular_file", "live_listener"])
def test_taken_socket_path_is_taken_over(scenario, server_dir, expected_tools, squatter):
    """A stale file (bind used to fail: 'exited during start-up') or a listener (it used to pass for ready)."""
    sock_path = str(server_dir / "mcp.sock")
    listener = None
    if squatter == "regular_file":
        Path(sock_path).write_text("left over")
    else:
        listener = Listener(sock_path)
    server = ScenarioServer(scenario, server_dir, server_dir / "live.db", server_dir.parent / "server.log")
    try:
        with no_leftover_children():
            try:
                server.start()
                assert server.alive()
                assert_serves_the_scenario(server.socket_path, server.alive, server_dir / "live.db", expected_tools)
            finally:
                server.stop()
        if listener is not None:
            assert listener.accepted == []  # neither the readiness probe nor MCP went to the impostor
    finally:
        if listener is not None:
            listener.close()


def test_listener_appearing_after_spawn_is_not_taken_for_ready(scenario, server_dir):
    """Our child never binds (its app hangs at import); a foreign listener takes the path: a clear timeout."""
    hung = dataclasses.replace(scenario, env_code="import time\ntime.sleep(3600)\n")
    server = ScenarioServer(
        hung, server_dir, server_dir / "live.db", server_dir.parent / "server.log", start_timeout=3.0
    )
    listeners: list[Listener] = []

    def squat() -> None:
        deadline = time.monotonic() + 30
        while server.proc is None and time.monotonic() < deadline:
            time.sleep(0.01)
        listeners.append(Listener(server.socket_path))

    squatter = threading.Thread(target=squat, daemon=True)
    with no_leftover_children():
        squatter.start()
        t0 = time.perf_counter()
        with pytest.raises(ScenarioError, match="did not start within 3s"):
            server.start()
        assert time.perf_counter() - t0 < 15
        squatter.join(5)
    assert listeners and not server.alive()
    listeners[0].close()


def test_unremovable_socket_path_is_a_clear_error(scenario, server_dir):
    """A directory at the socket path cannot be unlinked: ScenarioError naming it, and nothing is spawned."""
    (server_dir / "mcp.sock").mkdir()
    (server_dir / "mcp.sock" / "x").write_text("x")
    server = ScenarioServer(scenario, server_dir, server_dir / "live.db", server_dir.parent / "server.log")
    with no_leftover_children():
        t0 = time.perf_counter()
        with pytest.raises(ScenarioError, match=r"cannot take over the server socket path .*/mcp\.sock"):
            server.start()
        assert time.perf_counter() - t0 < 5
    assert server.proc is None


def test_restart_after_sigkill_takes_over_the_socket_path(scenario, expected_tools):
    """The restart path reuses server/: the killed server's dead socket and then a squatter are both there."""
    dirs_before = set(Path(tempfile.gettempdir()).glob("echo_trl_awm_*"))
    with no_leftover_children():
        rt = AWMRuntime(scenario, tool_timeout=20.0).start()
        root = rt.root
        listener = None
        try:
            assert root is not None and {t["name"] for t in rt.tools} == expected_tools
            sock_path = rt.server.socket_path
            pgid = rt.server.proc.pid
            os.killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while sandbox.group_members(pgid) and time.monotonic() < deadline:  # SIGKILL is asynchronous
                time.sleep(0.02)
            # what a SIGKILLed server leaves: a socket file nobody listens on
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe, pytest.raises(ConnectionRefusedError):
                probe.connect(sock_path)
            os.unlink(sock_path)
            listener = Listener(sock_path)  # ... and another listener that grabbed the path meanwhile
            ep = rt.new_episode(0)
            assert any("restarted" in n for n in ep.notes)
            obs = ep.call_tool("list_branches", {})
            assert obs["reward_type"] == "tool_call_ok", obs
            assert all(n in obs["tool_result"] for n in branch_names(rt.live_db))
            ep.close()
            assert listener.accepted == []
        finally:
            rt.close()
            if listener is not None:
                listener.close()
    assert root is not None and not root.exists()
    assert set(Path(tempfile.gettempdir()).glob("echo_trl_awm_*")) <= dirs_before


def test_initialize_answered_500_by_a_live_server_is_retried_and_nothing_else_is(monkeypatch):
    """A just-started server may answer its first MCP initialize with HTTP 500: open() retries that while the
    server is alive; other failures (and a dead server's) are reported at once."""
    import httpx

    from echo_trl.envs.awm import mcp_client

    def failure(status):
        response = httpx.Response(status, request=httpx.Request("POST", "http://awm-scenario/mcp"))
        error = mcp_client.MCPError("MCP connect + initialize failed")
        error.server_error = mcp_client._server_error(
            ExceptionGroup("anyio", [httpx.HTTPStatusError("x", request=response.request, response=response)])
        )
        return error

    monkeypatch.setattr(mcp_client.MCPSession, "STARTUP_DELAY", 0.0)
    for status, alive, expect_calls, opens in [(500, True, 3, True), (404, True, 1, False), (500, False, 1, False)]:
        calls = []

        def once(self, status=status, calls=calls):
            calls.append(1)
            if len(calls) < 3:
                raise failure(status)
            return self

        monkeypatch.setattr(mcp_client.MCPSession, "_open_once", once)
        session = mcp_client.MCPSession("/nonexistent.sock", alive=lambda alive=alive: alive)
        if opens:
            assert session.open() is session
        else:
            with pytest.raises(mcp_client.MCPError):
                session.open()
        assert len(calls) == expect_calls, (status, alive)
