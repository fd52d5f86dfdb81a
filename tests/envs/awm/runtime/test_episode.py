"""Acceptance: a real AWM scenario server (content_platform_1) over MCP, observations -> roles, faults."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from helpers.processes import descendant_pids

from echo_trl.data.readers.records import awm_episode_to_trajectory, load_awm_episodes
from echo_trl.envs.awm.runtime.episode import AWMRuntime
from echo_trl.envs.awm.scenario.source import ScenarioSource, VerifierSpec
from echo_trl.roles import Role
from echo_trl.sandbox import bwrap as sandbox

SAMPLES = Path(__file__).resolve().parents[5] / "shared" / "data" / "awm1k_samples"


def _source() -> ScenarioSource:
    if not SAMPLES.is_dir():
        pytest.skip(f"shared AWM-1K samples not found at {SAMPLES} (they live in ../shared/data, not in the repo)")
    return ScenarioSource.from_dir(SAMPLES)


@pytest.fixture(scope="module")
def runtime():
    rt = AWMRuntime(_source().load("content_platform_1")).start()
    yield rt
    rt.close()


def test_server_lists_34_tools_over_mcp(runtime):
    assert len(runtime.tools) == 34
    tool = next(t for t in runtime.tools if t["name"] == "search_channels")
    assert set(tool) == {"name", "description", "inputSchema"}
    assert tool["inputSchema"]["required"] == ["query"]
    assert runtime.timings["server_start"] < 60


def test_tool_calls_become_the_right_observations_and_roles(runtime):
    ep = runtime.new_episode(0)
    ok = ep.call_tool("search_channels", {"query": "Kurzgesagt"})
    assert ok["reward_type"] == "tool_call_ok" and "Kurzgesagt" in ok["tool_result"] and "error" not in ok
    sub = ep.call_tool("subscribe_to_channel", {"channel_id": 1})
    assert sub["reward_type"] == "tool_call_ok", sub
    missing = ep.call_tool("get_channel_by_id", {"channel_id": 999999})
    # the generated app answers a missing id with HTTP 500: an env error observation, not a format error
    assert missing["reward_type"] == "server_error" and "Status code: 500" in missing["error"]
    assert not missing["done"]
    bad = ep.call_tool("search_channels", {"query": 12})
    assert bad["reward_type"] == "invalid_args" and "not of type 'string'" in bad["error"] and not bad["done"]
    assert not ep.done  # AWM: the episode goes on after a format error ...
    assert ep.verify()["reward_type"] == "no_verifier"
    assert ep.reward == -1.0 and ep.reward_type == "format_error" and ep.verifier_reward == 0.0  # ... at -1.0
    record = ep.record()
    ep.close()
    assert [s["observation"]["reward_type"] for s in record["steps"]] == [
        "tool_call_ok",
        "tool_call_ok",
        "server_error",
        "invalid_args",
        "no_verifier",
    ]
    assert record["reward"] == -1.0 and record["metadata"]["format_errors"] == 1
    record["steps"].pop()  # the roles of the tool steps
    traj = awm_episode_to_trajectory(record)
    roles = traj.message_roles()
    assert roles[:2] == [Role.CONTEXT, Role.CONTEXT]
    assert roles[2:] == [Role.ACTION, Role.ENV_OUTPUT] * 4
    assert traj.completion[1]["content"] == ok["tool_result"]  # env output verbatim
    assert traj.completion[-1]["content"] == bad["error"]
    assert traj.tools[0]["function"]["parameters"]["required"] == ["query"]  # full MCP schemas kept
    assert traj.reward == -1.0


def test_unknown_tool_and_reset(runtime, monkeypatch):
    monkeypatch.setattr(runtime, "format_error_ends_episode", True)  # the stricter rule: stop at the first one
    ep = runtime.new_episode(0)
    # the previous episode's subscription is gone: the database was restored from the snapshot
    assert ep.call_tool("subscribe_to_channel", {"channel_id": 1})["reward_type"] == "tool_call_ok"
    assert runtime.timings["reset"] < 1.0
    unknown = ep.call_tool("subscribe", {"channel": "Kurzgesagt"})
    assert unknown["reward_type"] == "tool_not_found" and unknown["error"] == "Unknown tool: subscribe"
    assert ep.reward == -1.0
    late = ep.call_tool("search_channels", {"query": "x"})
    assert late["reward_type"] == "episode_already_done"
    traj = awm_episode_to_trajectory(ep.record())
    assert traj.completion[2]["tool_calls"][0]["function"]["name"] == "subscribe"
    assert traj.message_roles()[-2:] == [Role.ACTION, Role.ENV_OUTPUT]
    ep.close()


def test_verify_without_verifier_and_episodes_load(runtime, tmp_path):
    ep = runtime.new_episode(3)
    ep.call_tool("search_videos", {"query": "x"})
    obs = ep.verify(final_answer="done")
    assert obs["reward_type"] == "no_verifier" and obs["done"] and "verify_result" not in obs
    assert obs["error"] == "No code verifier available for this task"  # the upstream server's words
    import json

    (tmp_path / "ep.jsonl").write_text(json.dumps(ep.record()) + "\n")
    trajs, skipped = load_awm_episodes([tmp_path])
    assert len(trajs) == 1 and not skipped and trajs[0].reward == 0.0
    ep.close()


def _runtime_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("echo_trl_awm_*")}


def test_fault_server_killed_mid_episode_and_hanging_verifier():
    """Kill the server during an episode, hang the verifier: clear errors, nothing left behind."""
    children_before = descendant_pids()
    dirs_before = _runtime_dirs()
    sc = _source().load("content_platform_1")
    sc.verifiers[(0, "code")] = VerifierSpec(
        sc.name,
        0,
        "code",
        "def verify_task_completion(a, b):\n    while True:\n        pass\n",
        "verify_task_completion",
        "test",
    )
    rt = AWMRuntime(sc, verifier_timeout=2.0, tool_timeout=10.0).start()
    root = rt.root
    try:
        assert root is not None and root.exists() and rt.server.alive()
        ep = rt.new_episode(0)
        assert ep.call_tool("search_channels", {"query": "K"})["reward_type"] == "tool_call_ok"
        os.killpg(rt.server.proc.pid, signal.SIGKILL)  # the server dies mid-episode
        t0 = time.perf_counter()
        obs = ep.call_tool("search_channels", {"query": "K"})
        assert time.perf_counter() - t0 < 10
        assert obs["reward_type"] == "server_error" and obs["done"]
        assert "environment failure" in obs["error"] and "scenario server exited" in obs["error"]
        traj = awm_episode_to_trajectory(ep.record())
        assert traj.message_roles()[-1] == Role.ENV_OUTPUT and "environment failure" in traj.completion[-1]["content"]
        ep.close()
        # the next episode restarts the server; its verifier hangs and is killed at the deadline
        ep2 = rt.new_episode(0)
        assert any("restarted" in n for n in ep2.notes)
        v = ep2.verify()
        assert v["reward_type"] == "judge_error" and v["verify_result"]["execution_status"] == "error"
        assert (
            v["metadata"]["execution_status"] == "timeout" and "did not finish" in v["verify_result"]["error_message"]
        )
        assert ep2.reward == 0.0
        ep2.close()
    finally:
        rt.close()
    assert not root.exists()
    assert _runtime_dirs() <= dirs_before
    time.sleep(0.2)
    leftover = descendant_pids() - children_before
    assert not leftover, [Path(f"/proc/{p}/cmdline").read_bytes() for p in leftover]
    assert not sandbox.live_children() or set(sandbox.live_children()) <= children_before


def test_closed_runtime_refuses_and_db_is_consistent(runtime):
    ep = runtime.new_episode(0)
    ep.call_tool("subscribe_to_channel", {"channel_id": 1})
    with contextlib.closing(sqlite3.connect(":memory:")) as c:
        c.deserialize(runtime.live_database())  # the live database exists only in the sandbox: its image
        assert c.execute("select count(*) from user_subscriptions where channel_id=1").fetchone()[0] >= 1
    ep.close()
    rt = AWMRuntime(runtime.scenario)
    rt.close()
    with pytest.raises(RuntimeError, match="closed"):
        rt.new_episode(0)


def test_dirs_of_killed_runs_are_removed_on_next_start(tmp_path):
    import subprocess

    from echo_trl.envs.awm.runtime.episode import remove_stale_dirs

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Path(tempfile.mkdtemp(prefix="echo_trl_awm_stale_"))
    (stale / "owner.pid").write_text(str(dead.pid))
    mine = Path(tempfile.mkdtemp(prefix="echo_trl_awm_live_"))
    (mine / "owner.pid").write_text(str(os.getpid()))
    try:
        assert str(stale) in remove_stale_dirs()
        assert not stale.exists() and mine.exists()
    finally:
        import shutil

        shutil.rmtree(mine, ignore_errors=True)


def test_stale_dirs_are_removed_however_deep_and_links_or_foreign_dirs_are_left_alone(tmp_path):
    """A 3,000-deep tree (shutil.rmtree's recursion gave up on it, and every later run failed), a link that
    looks like a stale dir (it must not be followed), a bad owner file: none stops the clean-up."""
    import subprocess

    from echo_trl.envs.awm.runtime.episode import remove_stale_dirs

    dead = subprocess.Popen(["true"])
    dead.wait()
    deep = Path(tempfile.mkdtemp(prefix="echo_trl_awm_deep_"))
    (deep / "owner.pid").write_text(str(dead.pid))
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(old)
    os.close(os.open("leaf.txt", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    os.close(fd)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "owner.pid").write_text(str(dead.pid))
    (victim / "keep.txt").write_text("keep")
    link = Path(tempfile.gettempdir()) / f"echo_trl_awm_link_{os.getpid()}"
    link.symlink_to(victim)
    bad = Path(tempfile.mkdtemp(prefix="echo_trl_awm_bad_"))
    (bad / "owner.pid").write_text("not a pid")
    try:
        removed = remove_stale_dirs()
        assert str(deep) in removed and not deep.exists()
        assert (victim / "keep.txt").exists() and str(link) not in removed
        assert bad.exists()
    finally:
        link.unlink(missing_ok=True)
        shutil.rmtree(bad, ignore_errors=True)


def test_what_comes_back_is_read_bounded_and_only_from_regular_files(tmp_path):
    from echo_trl.sandbox import hostio

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(hostio.NotRegular):
            hostio.read_bounded(fd, 100, "a fifo")
        assert hostio.read_tail(fd, 100) == b""
    finally:
        os.close(fd)
    out = hostio.output_memfd("out")
    os.write(out, b"x" * 1000)
    with pytest.raises(hostio.TooLarge, match="1000 bytes, over the 999-byte cap"):
        hostio.read_bounded(out, 999, "the result")
    assert hostio.read_bounded(out, 1000, "the result") == b"x" * 1000 and hostio.read_tail(out, 3) == b"xxx"
    os.close(out)
    sealed = hostio.sealed_memfd(b"input", "in")
    with pytest.raises(PermissionError):
        os.pwrite(sealed, b"X", 0)
    assert os.pread(sealed, 10, 0) == b"input"
    os.close(sealed)
    with pytest.raises(OSError):  # a link is never opened
        (tmp_path / "link").symlink_to(tmp_path / "target")
        (tmp_path / "target").write_text("t")
        hostio.open_regular(tmp_path / "link")
