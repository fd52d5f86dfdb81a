"""``echo-trl capture --policy openai:URL`` against a real OpenAI-compatible server (``transformers serve``, loopback).

One server for the module (a tiny local model that calls library_1's tools, helpers/inference_server.py), loaded
lazily by model path as ``transformers serve`` does. Captures run as subprocesses, as a user runs them: both
conversation formats; two scenarios with 4 episodes in flight; ``kill -9`` mid-run and a rerun that continues
without duplicates, then build and 2 offline training steps; a server answering 500 until the model appears; a
server that dies (one-line error, episodes so far kept).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers.inference_server import TransformersServer, tool_calling_model

from echo_trl.envs.awm.capture.store import EpisodeStore

LIBRARY = Path(__file__).resolve().parents[3] / "data" / "awm_scenarios"
pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning"),
    pytest.mark.skipif(
        not __import__("transformers.utils.import_utils", fromlist=["x"]).is_serve_available(),
        reason="transformers serve needs its serving extra (pip install 'transformers[serving]', in echo-trl[dev])",
    ),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return tool_calling_model(tmp_path_factory.mktemp("served") / "model")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = TransformersServer(None, tmp_path_factory.mktemp("serve") / "serve.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def two_scenarios(tmp_path_factory) -> Path:
    """An AWM-1K-format directory holding library_1 and a copy of it named library_2."""
    out = tmp_path_factory.mktemp("scenarios")
    for f in LIBRARY.glob("gen_*.jsonl"):
        lines = f.read_text().splitlines()
        copies = []
        for line in lines:
            rec = json.loads(line)
            key = "name" if "name" in rec and "scenario" not in rec else "scenario"
            copies.append(json.dumps({**rec, key: "library_2"}))
        (out / f.name).write_text("\n".join(lines + copies) + "\n")
    return out


def capture(data: Path, url: str, model: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "echo_trl.commands.cli",
        "capture",
        "--data",
        str(data),
        "--policy",
        f"openai:{url}",
        "--model",
        str(model),
        "--max-new-tokens",
        "8",
        "--max-steps",
        "2",
        "--output",
        str(out),
        *extra,
    ]


def run(cmd: list[str], timeout: float = 420) -> subprocess.CompletedProcess:
    env = {**os.environ, "ECHO_TRL_PROGRESS": "0", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def records(out: Path) -> list[dict]:
    return [json.loads(x) for f in sorted(out.glob("*_task*.jsonl")) for x in f.read_text().splitlines()]


def wait_for_episodes(out: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(f.read_text().count("\n") for f in out.glob("*_task*.jsonl")) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} episodes after {timeout}s")


def test_two_scenarios_concurrently_survive_kill_9_and_the_rerun_adds_no_duplicate(
    server, model, two_scenarios, tmp_path
):
    out = tmp_path / "out"
    names = tmp_path / "scenarios.txt"
    names.write_text("# the two scenarios\nlibrary_1\nlibrary_2  # a copy of library_1\n")
    cmd = capture(two_scenarios, server.url, model, out, "--scenario-file", str(names))
    cmd += ["--task-idx", "0", "--task-idx", "1", "--episodes", "2", "--concurrency", "4"]
    env = {**os.environ, "ECHO_TRL_PROGRESS": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    wait_for_episodes(out, 2, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = records(out)
    assert 2 <= len(before) < 8  # killed mid-run; every line written is a whole episode
    done = run(cmd)
    assert done.returncode == 0, done.stderr
    after = records(out)
    keys = [r["metadata"]["episode"]["key"] for r in after]
    expected = {f"library_{s}/{k}/{i}" for s in (1, 2) for k in (0, 1) for i in (0, 1)}
    assert sorted(keys) == sorted(expected)  # each job exactly once
    assert {json.dumps(r) for r in before} <= {json.dumps(r) for r in after}  # nothing written is rewritten
    summary = json.loads((out / "capture_summary.json").read_text())
    assert summary["episodes"] == 8 and summary["run"]["already_there"] == len(before)
    assert set(summary["scenarios"]) == {"library_1", "library_2"}
    for rec in after:
        turns = rec["sampler"]["turns"]
        assert turns and rec["sampler"]["model"] == str(model) and "behavior_logprobs" not in rec
        assert rec["sampler"]["alignment"]["status"] == "no-logprobs"  # transformers serve returns none
        called = [s for s in rec["steps"] if s["action"]["tool_name"] != "verify"]
        # every tool call the server parsed is a step of the episode, in order
        assert [c["name"] for t in turns for c in t.get("tool_calls", [])] == [
            s["action"]["tool_name"] for s in called
        ]
    steps = [s["observation"]["reward_type"] for r in after for s in r["steps"]]
    assert summary["steps"] == len(steps) and summary["format_errors"] == steps.count("tool_not_found")
    assert summary["tokens"]["completion"] == sum(
        t["usage"]["completion_tokens"] for r in after for t in r["sampler"]["turns"]
    )
    assert "episodes/s" in (out / "capture_log.txt").read_text()

    ds = tmp_path / "ds"
    built = run([sys.executable, "-m", "echo_trl.commands.cli", "build-dataset", str(out), "--output", str(ds)])
    assert built.returncode == 0, built.stderr
    trained = run(
        [
            sys.executable,
            "-m",
            "echo_trl.commands.cli",
            "train",
            "--model_name_or_path",
            str(model),
            "--dataset_name",
            str(ds),
            "--output_dir",
            str(tmp_path / "run"),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--num_generations",
            "2",
            "--use_cpu",
            "--report_to",
            "none",
            "--save_strategy",
            "no",
            "--gradient_checkpointing",
            "false",
            "--logging_steps",
            "1",
        ]
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 2


def test_the_awm_agent_format_speaks_list_tools_and_call_tool(server, model, tmp_path):
    out = tmp_path / "out"
    cmd = capture(LIBRARY, server.url, model, out, "--all-scenarios", "--task-idx", "0", "--episodes", "3")
    done = run([*cmd, "--format", "awm-agent", "--concurrency", "3"])  # every scenario of LIBRARY: library_1
    assert done.returncode == 0, done.stderr
    recs = records(out)
    assert len(recs) == 3 and all(r["metadata"]["format"] == "awm-agent" for r in recs)
    for rec in recs:
        assert "verification" in rec  # the official agent never shows the verifier
        for turn, step in zip(rec["sampler"]["turns"], rec["steps"], strict=False):
            assert "tool_calls" not in turn  # no tools in the request: the agent writes <tool_call> text
            if '"call_tool"' in turn["content"]:
                assert step["action"] == {"tool_name": "search_members", "arguments": {"query": "Priya Raman"}}
            else:  # a call of anything but list_tools / call_tool: the official "Unknown tool" reply
                assert step["observation"]["reward_type"] == "tool_not_found"
    # the summary counts the replies cut at --max-new-tokens 8, as the records hold them, and warns about them
    cut = [sum(t["finish_reason"] == "length" for t in r["sampler"]["turns"]) for r in recs]
    assert f"with a turn cut at the token limit: {sum(c > 0 for c in cut)} ({sum(cut)} turns)" in done.stderr
    assert ("have a reply cut at the token limit" in done.stderr) is (sum(cut) > 0)
    built = run(
        [sys.executable, "-m", "echo_trl.commands.cli", "build-dataset", str(out), "--output", str(tmp_path / "ds")]
        + ["--format", "awm-agent"]
    )
    assert built.returncode == 0, built.stderr


def test_a_server_answering_500_is_retried_until_it_recovers(server, model, tmp_path):
    late = tmp_path / "late-model"  # transformers serve answers 500 while the model it is asked for cannot load
    out = tmp_path / "out"
    cmd = capture(LIBRARY, server.url, late, out, "--scenario", "library_1", "--task-idx", "0", "--episodes", "2")
    env = {**os.environ, "ECHO_TRL_PROGRESS": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [*cmd, "--retry-backoff", "0.5", "--max-retries", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    time.sleep(3)
    assert proc.poll() is None  # still retrying
    body = json.dumps({"model": str(late), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    request = urllib.request.Request(f"{server.url}/chat/completions", body, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=30)
    assert answer.value.code == 500  # what the capture is being answered meanwhile
    shutil.copytree(model, tmp_path / "staging")
    os.replace(tmp_path / "staging", late)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert len(records(out)) == 2


def test_a_server_that_dies_ends_the_run_in_one_line_and_keeps_the_episodes(model, tmp_path):
    own = TransformersServer(model, tmp_path / "serve.log").start()  # its own server: this one is killed
    out = tmp_path / "out"
    cmd = capture(LIBRARY, own.url, model, out, "--scenario", "library_1", "--episodes", "4")
    cmd += ["--retry-backoff", "0.2", "--max-retries", "2"]
    env = {**os.environ, "ECHO_TRL_PROGRESS": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for_episodes(out, 1, proc)
    finally:
        own.stop()
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("echo-trl capture: error: inference server "), stderr
    assert "still failing after 3 tries" in lines[0] and "rerun the same command to continue" in lines[0]
    kept = records(out)
    assert len(kept) >= 1 and all(r["reward_type"] != "unfinished" for r in kept)


def test_a_torn_last_line_is_cut_and_complete_lines_are_kept(tmp_path):
    whole = json.dumps({"scenario": "s", "task_idx": 0, "metadata": {"episode": {"key": "s/0/0", "index": 0}}})
    f = tmp_path / "s_task0.jsonl"
    f.write_text(whole + "\n" + whole[:25])  # a kill -9 inside the write of the second episode
    store = EpisodeStore(tmp_path)
    store.acquire()
    try:
        assert f.read_text() == whole + "\n" and store.done_keys() == {"s/0/0"}
        assert store.repaired == ["s_task0.jsonl: cut 25 bytes of an episode left half-written"]
    finally:
        store.release()
