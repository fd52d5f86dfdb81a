"""ScenarioServer: a socket the host binds, readiness over a pipe, the live database over a channel.

Nothing the server can write is a path the host uses: the socket is bound by the host in its
private run dir and passed in as a descriptor, readiness is one byte on a pipe, the live database
exists only in the sandbox and crosses as bounded images. A server that never starts, signals
junk, or answers database requests out of step or oversized fails in bounded time with a clear
error. Every test checks that no child process is left. Uses the repo's own scenario
(data/awm_scenarios, library_1), so nothing here needs ../shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sqlite3
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.processes import descendant_pids

from echo_trl.clients.mcp import MCPSession
from echo_trl.envs.awm.runtime.episode import AWMRuntime
from echo_trl.envs.awm.runtime.server import DatabaseUnavailable, ScenarioServer
from echo_trl.envs.awm.scenario.database import build_image
from echo_trl.envs.awm.scenario.source import Scenario, ScenarioError, ScenarioSource
from echo_trl.sandbox import bwrap as sandbox

DATA = Path(__file__).resolve().parents[4] / "data" / "awm_scenarios"
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
def run_dir() -> Iterator[Path]:
    """A private run dir, as AWMRuntime makes one; removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="echo_trl_srv_"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def assert_serves_the_scenario(server: ScenarioServer, expected_tools: set[str]) -> None:
    """Our server answers: its MCP tools are the spec's, and a tool returns rows from the episode database."""
    with MCPSession(server.socket_path, timeout=20, alive=server.alive) as session:
        assert {t["name"] for t in session.list_tools()} == expected_tools
        out = session.call_tool("list_branches", {})
    names = _tables(server.save_database(), "select name from branches")
    assert not out.is_error and names and all(n in out.text for n in names), out.text[:300]


def _library_image(scenario: Scenario) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        return build_image(scenario, d)[1]


def _tables(image: bytes, query: str) -> list:
    with contextlib.closing(sqlite3.connect(":memory:")) as c:
        c.deserialize(image)
        return [r[0] for r in c.execute(query)]


def test_the_host_binds_the_socket_in_its_private_dir_and_the_sandbox_writes_nothing_there(
    scenario, run_dir, expected_tools
):
    image = _library_image(scenario)
    server = ScenarioServer(scenario, run_dir, image)
    with no_leftover_children():
        try:
            server.start()
            assert_serves_the_scenario(server, expected_tools)
            assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
            entries = {p.name: os.lstat(p) for p in run_dir.iterdir()}
            assert set(entries) == {"mcp.sock", "server.log"}
            assert stat.S_ISSOCK(entries["mcp.sock"].st_mode) and stat.S_ISREG(entries["server.log"].st_mode)
            assert all(st.st_uid == os.geteuid() for st in entries.values())  # none made by the sandbox uid
        finally:
            server.close()


def test_a_server_that_never_listens_times_out(scenario, run_dir):
    hung = dataclasses.replace(scenario, env_code="import time\ntime.sleep(3600)\n")
    server = ScenarioServer(hung, run_dir, _library_image(scenario), start_timeout=3.0)
    with no_leftover_children():
        t0 = time.perf_counter()
        with pytest.raises(ScenarioError, match="did not start within 3s"):
            server.start()
        assert time.perf_counter() - t0 < 15
    assert not server.alive()
    server.close()


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "import os, sys, time\nos.write(int(sys.argv[4]), b'junk')\ntime.sleep(3600)\n",
            "wrote b'j' to its readiness",
        ),
        ("import os, sys, time\nos.close(int(sys.argv[4]))\ntime.sleep(3600)\n", "closed its readiness pipe"),
        ("import sys\nsys.exit(7)\n", r"exited during start-up \(exit code 7\)"),
    ],
    ids=["junk", "closed", "exits"],
)
def test_a_server_that_signals_junk_closes_its_pipe_or_exits_is_a_clear_start_error(scenario, run_dir, code, message):
    odd = dataclasses.replace(scenario, env_code=code)
    server = ScenarioServer(odd, run_dir, _library_image(scenario), start_timeout=30.0)
    with no_leftover_children():
        t0 = time.perf_counter()
        with pytest.raises(ScenarioError, match=message):
            server.start()
        assert time.perf_counter() - t0 < 20
    server.close()


def test_the_live_database_is_saved_loaded_and_reset_through_the_server(scenario, run_dir):
    image = _library_image(scenario)
    count = "select count(*) from branches"
    server = ScenarioServer(scenario, run_dir, image)
    with no_leftover_children():
        try:
            server.start()
            saved = server.save_database()
            assert _tables(saved, count) == _tables(image, count) and _tables(saved, count)[0] > 0
            with contextlib.closing(sqlite3.connect(":memory:")) as c:  # an image with one branch fewer
                c.deserialize(image)
                c.execute("delete from branches where id = (select min(id) from branches)")
                c.commit()
                smaller = c.serialize()
            server.load_database(smaller)
            assert _tables(server.save_database(), count) == [_tables(image, count)[0] - 1]
            with MCPSession(server.socket_path, timeout=20, alive=server.alive) as session:
                listed = session.call_tool("list_branches", {}).text  # the server's own connections see it
            names = _tables(image, "select name from branches order by id")
            assert names[0] not in listed and names[1] in listed
            server.reset_database()
            assert _tables(server.save_database(), count) == _tables(image, count)
        finally:
            server.close()


PATCH_CHANNEL = """
import sys as _sys
_main = _sys.modules["__main__"]
{patch}
"""


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (  # a reply that claims 300 MB: refused from its header, never read
            "_main._answer = lambda *a: bytes(300 << 20)",
            "over the 268435456 cap",
        ),
        (  # a reply with another request's id, sent before the host even asks
            "import os\nos.write(int(_sys.argv[5]), b'K' + bytes(8) + (5).to_bytes(8, 'big') + b'hello')",
            "out of step",
        ),
        ("import time\n_main._answer = lambda *a: time.sleep(3600)", "no complete reply before the deadline"),
    ],
    ids=["oversized", "out_of_step", "silent"],
)
def test_a_database_channel_the_server_abuses_is_refused_in_bounded_time(scenario, run_dir, patch, message):
    code = scenario.env_code.split('\nif __name__ == "__main__":')[0] + PATCH_CHANNEL.format(patch=patch)
    server = ScenarioServer(dataclasses.replace(scenario, env_code=code), run_dir, _library_image(scenario))
    server.control_timeout = 3.0
    with no_leftover_children():
        try:
            server.start()
            t0 = time.perf_counter()
            with pytest.raises(DatabaseUnavailable, match=message):
                server.save_database()
            assert time.perf_counter() - t0 < 10
            with pytest.raises(DatabaseUnavailable):  # the channel is closed: nothing reads a stale reply later
                server.reset_database()
        finally:
            server.close()


def test_restart_after_sigkill_serves_again(scenario, expected_tools):
    """The restart path: the killed server's socket file is replaced by a fresh one the host binds."""
    dirs_before = set(Path(tempfile.gettempdir()).glob("echo_trl_awm_*"))
    with no_leftover_children():
        rt = AWMRuntime(scenario, tool_timeout=20.0).start()
        root = rt.root
        try:
            assert root is not None and {t["name"] for t in rt.tools} == expected_tools
            pgid = rt.server.proc.pid
            os.killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while sandbox.group_members(pgid) and time.monotonic() < deadline:  # SIGKILL is asynchronous
                time.sleep(0.02)
            ep = rt.new_episode(0)
            assert any("restarted" in n for n in ep.notes)
            obs = ep.call_tool("list_branches", {})
            assert obs["reward_type"] == "tool_call_ok", obs
            names = _tables(rt.live_database(), "select name from branches")
            assert names and all(n in obs["tool_result"] for n in names)
            ep.close()
        finally:
            rt.close()
    assert root is not None and not root.exists()
    assert set(Path(tempfile.gettempdir()).glob("echo_trl_awm_*")) <= dirs_before


def test_initialize_answered_500_by_a_live_server_is_retried_and_nothing_else_is(monkeypatch):
    """A just-started server may answer its first MCP initialize with HTTP 500: open() retries that while the
    server is alive; other failures (and a dead server's) are reported at once."""
    import httpx

    from echo_trl.clients import mcp as mcp_client

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
