"""Rewards, reward types and observations agree with the upstream OpenEnv AWM server's.

The expectation is ``tests/fixtures/upstream_awm/recordings.jsonl``: what OpenEnv's own
``agent_world_model_env`` server answered to each call sequence (README there: how, which
versions). The local runtime replays every sequence and must give the same observation, reward
type and reward per step; the OpenEnv client is served the recorded replies by a playback
server and must record the same episode as the local runtime.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers.shared_data import AWM1K_SAMPLES

from echo_trl.envs.awm.capture.openenv import OpenEnvAWMClient, RemoteEpisode, capture_openenv_episode
from echo_trl.envs.awm.policies.replay import ReplayPolicy, Script
from echo_trl.envs.awm.policies.replay_check import normalize_timestamps
from echo_trl.envs.awm.runtime.episode import AWMRuntime, Episode
from echo_trl.envs.awm.scenario.source import ScenarioSource

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "upstream_awm"
LIBRARY = Path(__file__).resolve().parents[4] / "data" / "awm_scenarios"
RECORDINGS = {
    r["name"]: r for r in map(json.loads, (FIXTURES / "recordings.jsonl").read_text(encoding="utf-8").splitlines())
}
NOT_AN_OBJECT = "library_1 arguments that are not an object"
NO_TASK_INDEX = "library_1 no task index"
BUNDLED = [n for n in RECORDINGS if n.startswith("data/episodes/")]
STEPWISE = [n for n in RECORDINGS if n != NOT_AN_OBJECT]


def upstream_steps(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's replies to the calls and the verify step (reset, list_tools and done left out)."""
    return [ex["reply"]["data"] for ex in rec["exchanges"][2:-1]]


def comparable(obs: dict[str, Any]) -> str:
    """An observation less echo_trl's bookkeeping (done, metadata), timestamps normalised, as text."""
    return normalize_timestamps(
        json.dumps({k: v for k, v in obs.items() if k not in ("done", "metadata")}, sort_keys=True)
    )


def expected_episode(rec: dict[str, Any]) -> tuple[str, float]:
    """AWM's episode outcome from the server's step rewards: -1.0 after any format error, else the
    verifier's reward (0.0 when the episode stopped without verifying)."""
    steps = upstream_steps(rec)
    if any(s["reward"] == -1.0 for s in steps):
        return "format_error", -1.0
    if rec["end"] == "done":
        return "stopped", 0.0
    return steps[-1]["observation"]["reward_type"], steps[-1]["reward"]


@pytest.fixture(scope="module")
def runtimes():
    started: dict[str, AWMRuntime] = {}
    yield lambda name: started.get(name) or started.setdefault(name, _start(name))
    for rt in started.values():
        rt.close()


def _start(scenario: str) -> AWMRuntime:
    if scenario == "library_1":
        source = ScenarioSource.from_dir(LIBRARY)
    elif AWM1K_SAMPLES.is_dir():
        source = ScenarioSource.from_dir(AWM1K_SAMPLES)
    else:
        pytest.skip(f"needs the AWM-1K sample data (CC-BY-4.0, not in the repository) at {AWM1K_SAMPLES}")
    return AWMRuntime(source.load(scenario)).start()


def play_local(runtime: AWMRuntime, rec: dict[str, Any]) -> Episode:
    """The recorded calls on the local runtime, ended as recorded (verify, or stop)."""
    reset = rec["reset"]
    ep = runtime.new_episode(reset.get("task_idx"), task=reset.get("task"))
    try:
        for name, arguments in rec["calls"]:
            ep.call_tool(name, arguments)
            if ep.done:
                break
        if rec["end"] == "done":
            ep.end_without_verifying()
        else:
            mode, runtime.verifier_mode = runtime.verifier_mode, rec["end"]["verifier_mode"]
            try:
                ep.verify(rec["end"].get("final_answer"))
            finally:
                runtime.verifier_mode = mode
    finally:
        ep.close()
    return ep


@pytest.mark.parametrize("name", STEPWISE)
def test_the_local_runtime_answers_every_step_as_the_upstream_server(runtimes, name):
    rec = RECORDINGS[name]
    ep = play_local(runtimes(rec["reset"]["scenario"]), rec)
    want = upstream_steps(rec)
    assert len(ep.steps) == len(want)
    for i, (step, up) in enumerate(zip(ep.steps, want, strict=True)):
        assert step["observation"]["reward_type"] == up["observation"]["reward_type"], (i, step, up)
        assert step["reward"] == up["reward"], (i, step, up)
        assert comparable(step["observation"]) == comparable(up["observation"]), i
    assert (ep.reward_type, ep.reward) == expected_episode(rec)


def test_the_bundled_episodes_are_all_recorded_upstream():
    assert len(BUNDLED) == 60
    files = (LIBRARY.parent / "episodes").glob("*.jsonl")
    bundled = {f"data/episodes/{f.name}:{n}" for f in files for n in range(1, len(f.read_text().splitlines()) + 1)}
    assert set(BUNDLED) == bundled


def test_arguments_that_are_not_an_object_are_a_format_error_here(runtimes):
    """Upstream refuses such a message outright (no step, no reward); echo_trl records invalid_args."""
    rec = RECORDINGS[NOT_AN_OBJECT]
    refused = rec["exchanges"][2]["reply"]
    assert refused["type"] == "error" and refused["data"]["errors"][0]["type"] == "dict_type"
    ep = play_local(runtimes("library_1"), rec)
    assert [(s["observation"]["reward_type"], s["reward"]) for s in ep.steps] == [("invalid_args", -1.0)]
    assert (ep.reward_type, ep.reward) == ("format_error", -1.0)


# -- the OpenEnv client, served the recorded replies -------------------------------------------------


class Playback:
    """A WebSocket server answering each message with the recorded reply (an error for anything else)."""

    def __init__(self):
        self.recording: dict[str, Any] | None = None
        self.unexpected: list[Any] = []
        self.url = ""

    def handler(self, ws) -> None:
        exchanges = iter(self.recording["exchanges"] if self.recording else [])
        with contextlib.suppress(Exception):
            for raw in ws:
                msg = json.loads(raw)
                if msg.get("type") == "close":
                    return
                ex = next(exchanges, None)
                if ex is None or ex["send"] != msg:
                    self.unexpected.append(msg)
                    ws.send(json.dumps({"type": "error", "data": {"message": f"playback: unexpected {msg}"}}))
                    continue
                reply = ex["reply"]
                if isinstance(reply, str):  # the list_tools reply, kept once per scenario
                    reply = json.loads((FIXTURES / reply).read_text(encoding="utf-8"))
                ws.send(json.dumps(reply))


@pytest.fixture(scope="module")
def playback():
    from websockets.sync.server import serve

    pb = Playback()
    with serve(pb.handler, "127.0.0.1", 0, max_size=100 * 2**20) as srv:
        thread = threading.Thread(target=srv.serve_forever, daemon=True)
        thread.start()
        pb.url = f"http://127.0.0.1:{srv.socket.getsockname()[1]}"
        yield pb
        srv.shutdown()
        thread.join(10)


def play_client(pb: Playback, rec: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    pb.recording, pb.unexpected = rec, []
    end = rec["end"]
    script = Script(
        rec["reset"]["task_idx"],
        [tuple(c) for c in rec["calls"]],
        final_answer=None if end == "done" else end.get("final_answer"),
        verify=end != "done",
    )
    mode = "code" if end == "done" else end["verifier_mode"]
    record = capture_openenv_episode(
        pb.url, rec["reset"]["scenario"], script.task_idx, ReplayPolicy([script]), verifier_mode=mode, **kwargs
    )
    assert pb.unexpected == [], "the client sent what the recording does not hold"
    return record


@pytest.mark.parametrize("name", [n for n in STEPWISE if n != NO_TASK_INDEX])
def test_the_client_records_what_the_local_runtime_records(runtimes, playback, name):
    rec = RECORDINGS[name]
    remote = play_client(playback, rec)
    local = play_local(runtimes(rec["reset"]["scenario"]), rec).record()
    assert (
        (remote["reward_type"], remote["reward"]) == (local["reward_type"], local["reward"]) == expected_episode(rec)
    )
    assert len(remote["steps"]) == len(local["steps"])
    for r, lo in zip(remote["steps"], local["steps"], strict=True):
        assert (r["observation"]["reward_type"], r["reward"]) == (lo["observation"]["reward_type"], lo["reward"])
        assert comparable(r["observation"]) == comparable(lo["observation"])
        assert r["observation"]["done"] == lo["observation"]["done"]


def _stops_at_first_format_error(rec: dict[str, Any]) -> bool:
    steps = upstream_steps(rec)
    return rec["end"] == "done" and bool(steps) and steps[-1]["reward"] == -1.0


@pytest.mark.parametrize("name", [n for n in BUNDLED if _stops_at_first_format_error(RECORDINGS[n])][:3])
def test_an_early_stop_at_a_format_error_agrees(runtimes, playback, monkeypatch, name):
    rec = RECORDINGS[name]
    rt = runtimes("library_1")
    monkeypatch.setattr(rt, "format_error_ends_episode", True)
    local = play_local(rt, rec)
    remote = play_client(playback, rec, stop_on_format_error=True)
    first = upstream_steps(rec)[-1]["observation"]["reward_type"]
    assert (local.reward_type, local.reward) == (remote["reward_type"], remote["reward"]) == (first, -1.0)
    assert local.steps[-1]["observation"]["done"] and remote["steps"][-1]["observation"]["done"]


def test_the_client_never_sends_arguments_that_are_not_an_object(playback):
    rec = RECORDINGS[NOT_AN_OBJECT]
    sent = {**rec, "exchanges": [ex for i, ex in enumerate(rec["exchanges"]) if i != 2]}  # the refused message
    playback.recording, playback.unexpected = sent, []  # before connecting: the handler reads it per connection
    with OpenEnvAWMClient(playback.url) as client:
        ep = RemoteEpisode(client, "library_1", 0)
        obs = ep.call_tool("get_member", "abc")
        ep.end_without_verifying()
        ep.close()
    assert playback.unexpected == []
    assert obs["reward_type"] == "invalid_args" and ep.steps[-1]["reward"] == -1.0
    assert (ep.reward_type, ep.reward) == ("format_error", -1.0)
