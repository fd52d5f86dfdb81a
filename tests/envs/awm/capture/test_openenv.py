"""OpenEnv client against a local stand-in for the upstream ``agent_world_model_env`` server.

The upstream server (meta-pytorch/OpenEnv) is not a test dependency (openenv-core pulls fastmcp,
gradio and mcp-agent), so the stand-in below speaks the same WebSocket protocol (``/ws``: reset /
step{list_tools|call_tool} / close, observation payloads shaped like
``AWMObservation.model_dump(exclude_none=True)``) on top of the local runner, for the protocol, the
capture command and the client's failures. Agreement with the real server, reply by reply, is
``test_upstream_agreement.py`` (recorded from it).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import threading
import time
from pathlib import Path

import pytest
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from helpers.processes import descendant_pids

from echo_trl.commands.cli import main as cli
from echo_trl.data.readers.records import load_awm_episodes
from echo_trl.envs.awm.capture.openenv import OpenEnvAWMClient, OpenEnvError, capture_openenv_episode
from echo_trl.envs.awm.policies.replay import ReplayPolicy, Script
from echo_trl.envs.awm.runtime.episode import AWMRuntime
from echo_trl.envs.awm.scenario.source import ScenarioSource

SAMPLES = Path(__file__).resolve().parents[5] / "shared" / "data" / "awm1k_samples"


def standin_app(runtime: AWMRuntime):
    app = FastAPI()

    def obs_payload(obs: dict, reward=None, done=False):
        body = {k: v for k, v in obs.items() if v is not None and k not in ("done", "metadata")}
        return {"type": "observation", "data": {"observation": body, "reward": reward, "done": done}}

    @app.websocket("/ws")
    async def ws(websocket: WebSocket):
        await websocket.accept()
        episode = None
        try:
            while True:
                msg = json.loads(await websocket.receive_text())
                kind = msg.get("type")
                if kind == "close":
                    break
                if kind == "reset":
                    data = msg.get("data") or {}
                    if data.get("scenario") != runtime.scenario.name:
                        reply = obs_payload(
                            {"reward_type": "reset_error", "error": f"Scenario '{data.get('scenario')}' not found"}
                        )
                    else:
                        episode = await asyncio.to_thread(runtime.new_episode, data.get("task_idx"))
                        reply = obs_payload(
                            {
                                "reward_type": "reset_ok",
                                "scenario": runtime.scenario.name,
                                "task": episode.task,
                                "task_idx": episode.task_idx,
                                "num_tools": len(runtime.tools),
                            }
                        )
                elif kind == "step":
                    action = msg.get("data") or {}
                    if action.get("type") == "list_tools":
                        reply = {
                            "type": "observation",
                            "data": {
                                "observation": {
                                    "tools": [
                                        {
                                            "name": t["name"],
                                            "description": t["description"],
                                            "input_schema": t["inputSchema"],
                                        }
                                        for t in runtime.tools
                                    ]
                                },
                                "reward": None,
                                "done": False,
                            },
                        }
                    elif action.get("tool_name") == "done":
                        reply = obs_payload({"reward_type": "episode_done"}, 0.0, True)
                    elif action.get("tool_name") == "verify":
                        obs = await asyncio.to_thread(
                            episode.verify, (action.get("arguments") or {}).get("final_answer")
                        )
                        reply = obs_payload(obs, episode.steps[-1].get("reward"))
                    else:
                        obs = await asyncio.to_thread(episode.call_tool, action["tool_name"], action.get("arguments"))
                        reply = obs_payload(obs, episode.steps[-1].get("reward"))
                else:
                    reply = {
                        "type": "error",
                        "data": {"message": f"Unknown message type: {kind}", "code": "UNKNOWN_TYPE"},
                    }
                await websocket.send_text(json.dumps(reply))
        except WebSocketDisconnect:
            pass

    return app


@pytest.fixture(scope="module")
def server():
    if not SAMPLES.is_dir():
        pytest.skip(f"shared AWM-1K samples not found at {SAMPLES} (they live in ../shared/data, not in the repo)")
    import uvicorn

    runtime = AWMRuntime(
        ScenarioSource.from_dir(SAMPLES).load("content_platform_1"), format_error_ends_episode=False
    ).start()
    config = uvicorn.Config(
        standin_app(runtime), host="127.0.0.1", port=0, log_level="warning", ws="websockets-sansio"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)
    runtime.close()


def test_client_protocol(server):
    with OpenEnvAWMClient(server) as client:
        assert client.ws_url.endswith("/ws") and client.ws_url.startswith("ws://")
        obs = client.reset(scenario="content_platform_1", task_idx=0)
        assert obs["reward_type"] == "reset_ok" and obs["task"].startswith("Search for the channel")
        tools = client.list_tools()
        assert len(tools) == 34 and set(tools[0]) == {"name", "description", "inputSchema"}
        step = client.step("search_channels", {"query": "Kurz"})
        assert (
            step["observation"]["reward_type"] == "tool_call_ok" and "Kurzgesagt" in step["observation"]["tool_result"]
        )
        with pytest.raises(OpenEnvError, match="reset failed: Scenario 'nope' not found"):
            client.reset(scenario="nope")
        with pytest.raises(OpenEnvError, match="Unknown message type"):
            client._send({"type": "bogus"})
    with pytest.raises(OpenEnvError, match="cannot connect"):
        OpenEnvAWMClient("http://127.0.0.1:9", timeout=2).connect()


def test_capture_from_openenv_server(server, tmp_path):
    policy = ReplayPolicy(
        [
            Script(
                0,
                [("search_channels", {"query": "Kurzgesagt"}), ("subscribe_to_channel", {"channel_id": 1})],
                label="reference",
            ),
            Script(0, [("subscribe", {"x": 1})], label="unknown tool"),
        ]
    )
    rec = capture_openenv_episode(server, "content_platform_1", 0, policy)
    assert [s["action"]["tool_name"] for s in rec["steps"]] == ["search_channels", "subscribe_to_channel", "verify"]
    assert rec["steps"][-1]["observation"]["error"] == "No code verifier available for this task"
    assert rec["reward_type"] == "no_verifier" and rec["reward"] == 0.0
    assert len(rec["tools"]) == 34
    bad = capture_openenv_episode(server, "content_platform_1", 0, policy, episode_index=1)
    assert bad["reward"] == -1.0 and bad["steps"][0]["observation"]["error"] == "Unknown tool: subscribe"
    assert bad["steps"][-1]["action"]["tool_name"] == "verify"  # AWM: the episode went on to the verifier
    stop = capture_openenv_episode(
        server, "content_platform_1", 0, policy, episode_index=1, stop_on_format_error=True, verify_turn="omit"
    )
    assert stop["reward"] == -1.0 and [s["action"]["tool_name"] for s in stop["steps"]] == ["subscribe"]
    omit = capture_openenv_episode(server, "content_platform_1", 0, policy, verify_turn="omit")
    assert [s["action"]["tool_name"] for s in omit["steps"]] == ["search_channels", "subscribe_to_channel"]
    assert omit["verification"]["observation"]["reward_type"] == "no_verifier"
    (tmp_path / "e.jsonl").write_text(json.dumps(rec) + "\n" + json.dumps(bad) + "\n")
    trajs, skipped = load_awm_episodes([tmp_path])
    assert len(trajs) == 2 and not skipped


def test_awm_agent_turns_on_an_openenv_server(server):
    from echo_trl.data.readers import awm_agent
    from echo_trl.envs.awm.capture.openenv import RemoteEpisode
    from echo_trl.envs.awm.runtime.agent_turns import agent_reply

    with OpenEnvAWMClient(server) as client:
        ep = RemoteEpisode(client, "content_platform_1", 0)
        assert agent_reply(ep, awm_agent.action_for_call("list_tools")).startswith("Available MCP Tools (34 tools):")
        reply = agent_reply(
            ep,
            awm_agent.action_for_call(
                "call_tool", {"tool_name": "mcp_tool_search_channels", "arguments": '{"query": "Kurzgesagt"}'}
            ),
        )
        assert "Kurzgesagt" in reply
        assert agent_reply(ep, awm_agent.action_for_call("subscribe")) == awm_agent.unknown_tool_text("subscribe")
        assert ep.verify()["reward_type"] == "no_verifier" and ep.reward == -1.0 and ep.format_errors == 1
        assert [s["action"]["tool_name"] for s in ep.steps] == ["search_channels", "subscribe", "verify"]
        ep.close()


def test_capture_cli_openenv(server, tmp_path):
    replay = tmp_path / "r.jsonl"
    replay.write_text(
        json.dumps({"task_idx": 2, "calls": [{"tool_name": "search_videos", "arguments": {"query": "Spanish"}}]})
        + "\n"
    )
    out = tmp_path / "out"
    assert (
        cli(
            [
                "capture",
                "--openenv",
                server,
                "--scenario",
                "content_platform_1",
                "--policy",
                f"replay:{replay}",
                "--episodes",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    trajs, skipped = load_awm_episodes([out])
    assert len(trajs) == 2 and not skipped and trajs[0].task_idx == 2


# -- the URL is not an OpenEnv server: a clear OpenEnvError naming it, in bounded time ------------


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep test output clean
        pass


@contextlib.contextmanager
def _not_openenv(kind: str):
    """A loopback URL where no OpenEnv server is: nothing, a plain HTTP server, a silent TCP listener,
    or a WebSocket server whose replies are not the OpenEnv protocol."""
    if kind == "nothing":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    elif kind == "plain_http":
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _QuietHandler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()
            httpd.server_close()
    elif kind == "silent_tcp":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            yield f"http://127.0.0.1:{s.getsockname()[1]}"
    else:
        from websockets.sync.server import serve

        reply = {
            "ws_list": "[1, 2]",
            "ws_data_str": json.dumps({"type": "observation", "data": "x"}),
            "ws_error_str": json.dumps({"type": "error", "data": "boom"}),
            "ws_text": "hello",
            "ws_obs_list": json.dumps({"type": "observation", "data": {"observation": [1]}}),
            "ws_tools_str": json.dumps({"type": "observation", "data": {"observation": {"tools": "x"}}}),
        }[kind]

        def handler(ws):
            with contextlib.suppress(Exception):
                for _ in ws:
                    ws.send(reply)

        with serve(handler, "127.0.0.1", 0) as srv:
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            yield f"http://127.0.0.1:{srv.socket.getsockname()[1]}"
            srv.shutdown()


@pytest.mark.parametrize(
    "kind, message",
    [
        ("nothing", "cannot connect to"),
        ("plain_http", "cannot connect to"),
        ("silent_tcp", "cannot connect to"),
        ("ws_list", "malformed reply from"),
        ("ws_data_str", "malformed reply from"),
        ("ws_error_str", "malformed reply from"),
        ("ws_text", "malformed reply from"),
        ("ws_obs_list", "malformed reply from"),
        ("ws_tools_str", "malformed list_tools reply from"),
    ],
)
def test_client_fails_clearly_on_a_url_that_is_not_openenv(kind, message):
    children = descendant_pids()
    with _not_openenv(kind) as url:
        t0 = time.perf_counter()
        with pytest.raises(OpenEnvError) as err, OpenEnvAWMClient(url, timeout=1.5) as client:
            client.reset(scenario="content_platform_1", task_idx=0)
            client.list_tools()
        elapsed = time.perf_counter() - t0
    ws_url = "ws://" + url.removeprefix("http://") + "/ws"
    assert str(err.value).startswith(f"{message} {ws_url}"), str(err.value)
    assert elapsed < 1.5 + 3  # the handshake/reply deadline, plus closing
    assert descendant_pids() == children
