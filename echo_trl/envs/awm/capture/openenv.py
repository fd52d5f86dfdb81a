"""Capture episodes from a running upstream OpenEnv ``agent_world_model_env`` server.

The upstream server (``meta-pytorch/OpenEnv``, ``envs/agent_world_model_env``) is stateful and
only speaks OpenEnv's WebSocket protocol at ``/ws`` (its HTTP ``/reset`` and ``/step`` are
disabled). Messages, as ``openenv.core.EnvClient`` / ``MCPToolClient`` send them::

    -> {"type": "reset", "data": {"scenario": S, "task_idx": K, ...}}
    -> {"type": "step",  "data": {"type": "list_tools"}}
    -> {"type": "step",  "data": {"type": "call_tool", "tool_name": T, "arguments": {...}}}
       (hidden tools: "verify" {verifier_mode, final_answer}, "done" {keep_session})
    -> {"type": "close"}
    <- {"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}
    <- {"type": "error", "data": {"message": ..., "code": ...}}

This client speaks that protocol with ``websockets`` directly instead of importing
``openenv-core``: openenv-core 0.3.0 requires ``fastmcp>=3`` (which pulls ``mcp`` 2.x, breaking
fastapi-mcp 0.4.0, plus gradio and openai), so it does not install cleanly next to the local
runner. Observations are recorded as the server sends them (the OpenEnv capture shape), tools
as full MCP tool objects, and the same replay / model policies as ``echo-trl capture`` drive it.
"""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace
from typing import Any

from ....errors import EchoTrlError
from ..policies.policy import Policy, play_episode
from ..runtime.episode import ENDED, verify_turn_fields
from ..scenario.rewards import FORMAT_ERRORS, RewardConfig, episode_outcome, step_reward


class OpenEnvError(EchoTrlError):
    """The OpenEnv server refused a request or could not be reached."""


class OpenEnvAWMClient:
    """A synchronous client for one OpenEnv AWM session (one WebSocket = one server-side environment)."""

    def __init__(self, base_url: str, *, timeout: float = 60.0, max_message_mb: float = 100.0):
        url = base_url.rstrip("/")
        for http, ws in (("https://", "wss://"), ("http://", "ws://")):
            if url.startswith(http):
                url = ws + url[len(http) :]
        if not url.startswith(("ws://", "wss://")):
            url = "ws://" + url
        self.ws_url = url if url.endswith("/ws") else url + "/ws"
        self.timeout, self.max_size = timeout, int(max_message_mb * 1024 * 1024)
        self._ws = None

    def connect(self) -> OpenEnvAWMClient:
        from websockets.sync.client import connect

        try:
            self._ws = connect(self.ws_url, open_timeout=self.timeout, max_size=self.max_size, proxy=None)
        except Exception as exc:  # websockets raises many kinds; all mean "cannot reach it"
            raise OpenEnvError(
                f"cannot connect to {self.ws_url} (is an OpenEnv server listening there?): {exc}"
            ) from None
        return self

    def _send(self, message: dict[str, Any]) -> dict[str, Any]:
        if self._ws is None:
            self.connect()
        try:
            self._ws.send(json.dumps(message))
            raw = self._ws.recv(timeout=self.timeout)
        except TimeoutError:
            raise OpenEnvError(f"no reply from {self.ws_url} within {self.timeout:g}s") from None
        except Exception as exc:
            raise OpenEnvError(f"OpenEnv connection to {self.ws_url} failed: {exc}") from None
        reply = _parse_reply(raw)
        if reply is None:  # some other WebSocket server, or a broken one: an error, not an AttributeError
            raise OpenEnvError(f"malformed reply from {self.ws_url} (not the OpenEnv protocol): {str(raw)[:200]!r}")
        data = reply.get("data") or {}
        if reply.get("type") == "error":
            raise OpenEnvError(f"server error: {data.get('message', 'unknown')} (code {data.get('code', '?')})")
        return data

    def reset(self, **kwargs: Any) -> dict[str, Any]:
        """``reset(scenario=..., task_idx=...)``; returns the reset observation (raises on reset_error)."""
        data = self._send({"type": "reset", "data": kwargs})
        obs = data.get("observation") or {}
        if obs.get("reward_type") == "reset_error":
            raise OpenEnvError(f"reset failed: {obs.get('error')}")
        return obs

    def list_tools(self) -> list[dict[str, Any]]:
        obs = self._send({"type": "step", "data": {"type": "list_tools"}}).get("observation") or {}
        if obs.get("error"):
            raise OpenEnvError(f"list_tools failed: {obs['error']}")
        tools = obs.get("tools", [])
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise OpenEnvError(f"malformed list_tools reply from {self.ws_url}: {str(tools)[:200]!r}")
        return [
            {
                "name": t.get("name", ""),
                "description": t.get("description", ""),
                "inputSchema": t.get("input_schema", t.get("inputSchema", {})) or {},
            }
            for t in tools
        ]

    def step(self, tool_name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """One ``call_tool`` step: ``{"observation": {...}, "reward": r, "done": d}``."""
        return self._send(
            {"type": "step", "data": {"type": "call_tool", "tool_name": tool_name, "arguments": arguments or {}}}
        )

    def close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(Exception):  # best effort
                self._ws.send(json.dumps({"type": "close"}))
            with contextlib.suppress(Exception):
                self._ws.close()
            self._ws = None

    def __enter__(self) -> OpenEnvAWMClient:
        return self.connect()

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteEpisode:
    """An episode on an OpenEnv server with the interface the capture policies drive."""

    def __init__(
        self,
        client: OpenEnvAWMClient,
        scenario: str,
        task_idx: int,
        *,
        verifier_mode: str = "code",
        stop_on_format_error: bool = False,
    ):
        self.client, self.task_idx, self.verifier_mode = client, task_idx, verifier_mode
        self.stop_on_format_error = stop_on_format_error
        obs = client.reset(scenario=scenario, task_idx=task_idx)
        self._scenario = obs.get("scenario") or scenario
        self.task = obs.get("task") or ""
        tools = client.list_tools()
        self.runtime = SimpleNamespace(tools=tools, tool_timeout=client.timeout)
        self.steps: list[dict[str, Any]] = []
        self.done = False
        self.reward: float | None = None
        self.reward_type: str | None = None
        self.notes: list[str] = []
        self.behavior_logprobs: list[float] | None = None
        self.format_errors = 0
        self.rewards = RewardConfig()  # the server's defaults; only the format-error reward is used here
        self._verify_step: dict[str, Any] | None = None

    @property
    def scenario(self) -> str:
        return self._scenario

    def _step(
        self, tool_name: str, arguments: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], float | None]:
        data = self.client.step(tool_name, arguments)
        obs = dict(data.get("observation") or {})
        obs.setdefault("done", bool(data.get("done", False)))
        obs.setdefault("metadata", {})
        step = {"action": {"tool_name": tool_name, "arguments": arguments}, "observation": obs}
        if data.get("reward") is not None:
            step["reward"] = data["reward"]
        if extra:
            step.update(extra)
        self.steps.append(step)
        return obs, data.get("reward")

    def _here(self, tool_name: str, arguments: Any, obs: dict[str, Any], extra: dict[str, Any] | None) -> None:
        """Record a step answered here, not by the server (reward as the server would give it)."""
        obs = {**obs, "metadata": {}}
        step: dict[str, Any] = {"action": {"tool_name": tool_name, "arguments": arguments}, "observation": obs}
        if obs["reward_type"] != "episode_already_done":
            step["reward"] = step_reward(obs["reward_type"], self.rewards)
        self.steps.append({**step, **(extra or {})})

    def call_tool(
        self, tool_name: str, arguments: Any = None, *, extra: dict[str, Any] | None = None, refuse: str | None = None
    ) -> dict[str, Any]:
        """One tool call on the server; ``refuse``: rejected here with that error (see ``Episode.call_tool``).

        Arguments that are not a JSON object are ``invalid_args`` here, as on the local runtime
        (the server would refuse the message outright, with no step and no reward).
        """
        arguments = {} if arguments is None else arguments
        if self.done:
            self._here(
                tool_name, arguments, {"reward_type": "episode_already_done", "error": ENDED, "done": True}, extra
            )
            return self.steps[-1]["observation"]
        if refuse is not None:
            self._here(
                tool_name,
                arguments,
                {"reward_type": "tool_not_found", "tool_name": tool_name, "error": refuse, "done": False},
                extra,
            )
            obs, reward = self.steps[-1]["observation"], self.steps[-1]["reward"]
        elif not isinstance(arguments, dict):
            why = f"tool arguments must be a JSON object, got {type(arguments).__name__}"
            self._here(
                tool_name,
                {"_raw": arguments},
                {"reward_type": "invalid_args", "tool_name": tool_name, "error": why, "done": False},
                extra,
            )
            obs, reward = self.steps[-1]["observation"], self.steps[-1]["reward"]
        else:
            obs, reward = self._step(tool_name, arguments, extra)
        if obs.get("reward_type") in FORMAT_ERRORS:
            self.format_errors += 1
            if self.stop_on_format_error:  # the server itself goes on (AWM semantics); we stop asking
                self._end(obs["reward_type"], reward)
                obs["done"] = True
        return obs

    def _end(self, reward_type: str, reward: float | None) -> None:
        reward = step_reward(reward_type, self.rewards) if reward is None else float(reward)
        self.done = True
        self.reward_type, self.reward = episode_outcome(reward_type, reward, self.format_errors, self.rewards)

    def verify(self, final_answer: str | None = None) -> dict[str, Any]:
        """The server's verifier; ends this episode (the server would take more calls) with its reward."""
        args: dict[str, Any] = {"verifier_mode": self.verifier_mode}
        if final_answer is not None:
            args["final_answer"] = final_answer
        if self.done:
            self._here("verify", args, {"reward_type": "episode_already_done", "error": ENDED, "done": True}, None)
            return self.steps[-1]["observation"]
        obs, reward = self._step("verify", args)
        self._verify_step = self.steps[-1]
        obs["done"] = True
        self._end(str(obs.get("reward_type") or "judge_error"), reward)
        return obs

    def end_without_verifying(self, reason: str = "stopped") -> None:
        """Stop here without the verifier: reward 0.0, or the format-error reward after a format error."""
        if not self.done:
            self._end(reason, None)

    def close(self) -> None:
        with contextlib.suppress(OpenEnvError):
            self.client.step("done", {})

    def record(self, verify_turn: str = "env_output") -> dict[str, Any]:
        record = {
            "scenario": self.scenario,
            "task": self.task,
            "task_idx": self.task_idx,
            "tools": self.runtime.tools,
            **verify_turn_fields(self.steps, self._verify_step, verify_turn),
            "reward": self.reward if self.reward is not None else 0.0,
            "reward_type": self.reward_type or "unfinished",
            "metadata": {
                "source": f"OpenEnv agent_world_model_env at {self.client.ws_url}",
                "notes": self.notes,
                "format_errors": self.format_errors,
            },
        }
        if self.behavior_logprobs is not None:
            record["behavior_logprobs"] = self.behavior_logprobs
        return record


def _parse_reply(raw: str | bytes) -> dict[str, Any] | None:
    """The reply as a dict whose ``data`` (and its ``observation``) are dicts when present; else None."""
    try:
        reply = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(reply, dict):
        return None
    data = reply.get("data")
    if data is not None and not isinstance(data, dict):
        return None
    obs = (data or {}).get("observation")
    return reply if obs is None or isinstance(obs, dict) else None


def capture_openenv_episode(
    base_url: str,
    scenario: str,
    task_idx: int,
    policy: Policy,
    *,
    episode_index: int = 0,
    verifier_mode: str = "code",
    timeout: float = 60.0,
    stop_on_format_error: bool = False,
    verify_turn: str = "env_output",
) -> dict[str, Any]:
    """Play one episode on the server at ``base_url`` with ``policy`` (a replay or model policy)."""
    with OpenEnvAWMClient(base_url, timeout=timeout) as client:
        episode = RemoteEpisode(
            client, scenario, task_idx, verifier_mode=verifier_mode, stop_on_format_error=stop_on_format_error
        )
        return play_episode(policy, episode, episode_index, verify_turn)
