"""A running AWM scenario (:class:`AWMRuntime`) and its episodes (:class:`Episode`).

The runtime owns one private temp directory, the initial database image built from schema +
samples, and one contained scenario server, whose live database exists only in its sandbox.
Episodes reuse the server: ``new_episode`` has the server restore its live database from the
snapshot (SQLite backup API, milliseconds; a server that cannot is restarted) and opens a fresh
MCP session. Every step becomes an observation in the OpenEnv capture shape that
``echo_trl.data.records.load_awm_episodes`` reads::

    {"action": {"tool_name": str, "arguments": dict},
     "observation": {"tool_name", "tool_result" | "error" | "verify_result", "warning",
                     "reward_type", "done", "metadata"}}

``reward_type`` per step: ``tool_call_ok``; ``tool_not_found`` / ``invalid_args`` (format
errors, AWM reward -1.0); ``tool_error`` (the tool refused, e.g. 404); ``timeout`` /
``server_error`` (the environment failed: the episode ends); for the final ``verify`` step the
verifier's outcome (``complete``, ``others``, ``incomplete``, ``judge_error``, ``no_verifier``).

Format errors follow AWM's semantics by default: the episode goes on (the official agent and
OpenEnv's AWM environment let the agent recover), and its reward stays the format-error reward
(-1.0) whatever the verifier says; the verifier's own reward is kept as ``verifier_reward``.
``format_error_ends_episode=True`` restores the stricter rule (end at the first format error).

Cleanup is unconditional: ``close()`` (also via ``with``, ``atexit`` and garbage collection)
kills the server's process group and removes the temp directory, whatever happened; no file in
it was written by generated code.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from ...data.awm_agent import VERIFY_TURNS
from . import hostio, sandbox
from .database import BuildReport, build_image
from .mcp_client import MCPError, MCPSession
from .scenario import Scenario
from .server import DatabaseUnavailable, ScenarioServer
from .verifier import Judge, RewardConfig, VerifyOutcome, verify_databases

FORMAT_ERRORS = ("tool_not_found", "invalid_args")
_STATUS = re.compile(r"Status code: (\d{3})")


def classify_tool_error(text: str, *, known_tool: bool) -> str:
    """reward_type of a tool call MCP reported as an error."""
    if not known_tool or text.startswith("Unknown tool"):
        return "tool_not_found"
    if text.startswith("Input validation error") or "validation error" in text.lower()[:200]:
        return "invalid_args"
    m = _STATUS.search(text[:300])
    if m:
        code = int(m.group(1))
        if code == 422:
            return "invalid_args"
        if code >= 500:
            return "server_error"
        return "tool_error"
    if "timed out" in text.lower()[:300]:
        return "timeout"
    return "tool_error"


def remove_stale_dirs() -> list[str]:
    """Remove runtime dirs left by processes that were SIGKILLed (their servers died with them)."""
    return hostio.remove_stale_dirs("echo_trl_awm_*")


_runtimes: weakref.WeakSet[AWMRuntime] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for rt in list(_runtimes):
        rt.close()


class AWMRuntime:
    """One live scenario: database + snapshot + server in a private temp dir.

    Use as a context manager (or call :meth:`close`). ``timings`` records measured seconds:
    ``db_build``, ``server_start``, and the last ``reset`` / ``connect`` / ``verify``.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        tool_timeout: float = 30.0,
        verifier_timeout: float = 30.0,
        verifier_mode: str = "code",
        judge: Judge | None = None,
        rewards: RewardConfig | None = None,
        format_error_ends_episode: bool = False,
        containment: sandbox.Containment | None = None,
        keep_dir: bool = False,
        unsafe_no_sandbox: bool = False,
    ):
        self.scenario = scenario
        self.tool_timeout, self.verifier_timeout = tool_timeout, verifier_timeout
        self.verifier_mode, self.judge = verifier_mode, judge
        self.rewards = rewards or RewardConfig()
        self.format_error_ends_episode = format_error_ends_episode
        # Refuses (ContainmentUnavailable) unless bwrap works here or the caller explicitly opted out.
        self.containment = containment or sandbox.require_containment(unsafe_no_sandbox)
        self.keep_dir = keep_dir
        self.root: Path | None = None
        self.snapshot = b""  # the initial database image every episode starts from
        self.server: ScenarioServer | None = None
        self.tools: list[dict[str, Any]] = []
        self.build_report: BuildReport | None = None
        self.timings: dict[str, float] = {}
        self.episodes_started = 0
        self._episode: Episode | None = None
        self._lock = threading.RLock()
        self._closed = False
        _runtimes.add(self)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> AWMRuntime:
        """Build the database, snapshot it, start the server and list its tools."""
        self.scenario.require("env_code")
        try:
            remove_stale_dirs()
            self.root = hostio.make_run_dir(f"echo_trl_awm_{self.scenario.name[:40]}_")
            t0 = time.perf_counter()
            self.build_report, self.snapshot = build_image(self.scenario, self.root)
            self.timings["db_build"] = time.perf_counter() - t0
            self._start_server()
            with self._session() as session:
                self.tools = session.list_tools()
        except BaseException:
            self.close()
            raise
        return self

    def _start_server(self) -> None:
        assert self.root is not None
        if self.server is None:
            self.server = ScenarioServer(self.scenario, self.root, self.snapshot, containment=self.containment)
        self.timings["server_start"] = self.server.start()

    def _session(self) -> MCPSession:
        assert self.server is not None
        t0 = time.perf_counter()
        session = MCPSession(self.server.socket_path, timeout=self.tool_timeout, alive=self.server.alive).open()
        self.timings["connect"] = time.perf_counter() - t0
        return session

    def live_database(self) -> bytes:
        """The live database's bytes, from the server (:class:`DatabaseUnavailable` if it cannot say)."""
        assert self.server is not None
        return self.server.save_database()

    def close(self) -> None:
        """Kill the server (whole process group) and remove the temp dir; idempotent, never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._episode is not None:
                with contextlib.suppress(Exception):
                    self._episode.close()
            if self.server is not None:
                with contextlib.suppress(Exception):
                    self.server.close()
            if self.root is not None and not self.keep_dir:
                with contextlib.suppress(OSError):
                    hostio.remove_tree(self.root)
        _runtimes.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> AWMRuntime:
        return self.start() if self.server is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; explicit close() is the contract
        with contextlib.suppress(Exception):
            self.close()

    # -- episodes ----------------------------------------------------------------------------

    def new_episode(self, task_idx: int | None = None, *, task: str | None = None) -> Episode:
        """Reset the database to the initial snapshot and open a fresh MCP session.

        A server that died since the last episode is restarted (noted in the episode metadata).
        """
        with self._lock:
            if self._closed or self.server is None:
                raise RuntimeError("the AWM runtime is closed (or was never started)")
            if self._episode is not None:
                self._episode.close()
            if task is None:
                if task_idx is None:
                    raise ValueError("give task_idx or task")
                task = self.scenario.task(task_idx)
            notes = []
            restart = not self.server.alive()
            if restart:
                notes.append(f"{self.server.exit_description()}; restarted")
                self.server.stop()
            t0 = time.perf_counter()
            if self.episodes_started and not restart:  # a restarted server starts from the snapshot anyway
                try:
                    self.server.reset_database()
                except DatabaseUnavailable as exc:
                    notes.append(f"{exc}; restarted")
                    restart = True
                    self.server.stop()
            self.timings["reset"] = time.perf_counter() - t0
            if restart:
                self._start_server()
            session = self._session()
            self.episodes_started += 1
            self._episode = Episode(self, task, task_idx, session, notes)
            return self._episode

    def run_verifier(
        self,
        task_idx: int | None,
        *,
        final_answer: str | None = None,
        task: str = "",
        trajectory: list[dict[str, Any]] | None = None,
    ) -> VerifyOutcome:
        """Verify the live database against the initial snapshot (no verifier -> ``no_verifier``)."""
        outcome = verify_databases(
            self.scenario,
            task_idx,
            self.snapshot,
            self.live_database,
            verifier_mode=self.verifier_mode,
            timeout=self.verifier_timeout,
            judge=self.judge,
            containment=self.containment,
            final_answer=final_answer,
            task=task,
            trajectory=trajectory,
        )
        self.timings["verify"] = outcome.seconds
        return outcome


class Episode:
    """One episode on a runtime; ``steps`` accumulate in the OpenEnv capture shape."""

    def __init__(
        self, runtime: AWMRuntime, task: str, task_idx: int | None, session: MCPSession, notes: list[str] | None = None
    ):
        self.runtime, self.task, self.task_idx, self.session = runtime, task, task_idx, session
        self.steps: list[dict[str, Any]] = []
        self.done = False
        self.reward: float | None = None
        self.reward_type: str | None = None
        self.verifier_reward: float | None = None  # the outcome's reward, before the format-error rule
        self.format_errors = 0
        self._verify_step: dict[str, Any] | None = None
        self.notes = list(notes or [])
        self.behavior_logprobs: list[float] | None = None
        self.tool_names = {t["name"] for t in runtime.tools}

    @property
    def scenario(self) -> str:
        return self.runtime.scenario.name

    def _record(
        self, tool_name: str, arguments: Any, observation: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        step = {"action": {"tool_name": tool_name, "arguments": arguments}, "observation": observation}
        if extra:
            step.update(extra)
        self.steps.append(step)
        return observation

    def _end(self, reward_type: str) -> None:
        """End the episode; any format error on the way keeps the reward at the format-error reward."""
        rewards = self.runtime.rewards
        self.done = True
        self.verifier_reward = rewards.reward(reward_type)
        penalised = self.format_errors and reward_type not in FORMAT_ERRORS
        self.reward_type = "format_error" if penalised else reward_type
        self.reward = rewards.format_error if penalised else self.verifier_reward

    def call_tool(
        self, tool_name: str, arguments: Any = None, *, extra: dict[str, Any] | None = None, refuse: str | None = None
    ) -> dict[str, Any]:
        """Call one scenario tool over MCP and record the step; returns the observation.

        ``refuse``: the harness rejects the call itself with this error (an unknown tool, no
        server asked): recorded as ``tool_not_found`` under the same format-error rule.
        """
        arguments = {} if arguments is None else arguments
        if self.done:
            obs = {
                "tool_name": tool_name,
                "error": "the episode has ended; start a new episode",
                "reward_type": "episode_already_done",
                "done": True,
                "metadata": {},
            }
            return self._record(tool_name, arguments, obs, extra)
        t0 = time.perf_counter()
        known = tool_name in self.tool_names
        if refuse is not None:
            obs = {
                "tool_name": tool_name,
                "reward_type": "tool_not_found",
                "done": False,
                "metadata": {},
                "error": refuse,
            }
        elif not isinstance(arguments, dict):
            obs = {
                "tool_name": tool_name,
                "reward_type": "invalid_args",
                "done": False,
                "metadata": {},
                "error": f"tool arguments must be a JSON object, got {type(arguments).__name__}",
            }
            arguments = {"_raw": arguments}
        else:
            try:
                out = self.session.call_tool(tool_name, arguments, timeout=self.runtime.tool_timeout)
            except MCPError as exc:
                server = self.runtime.server
                why = server.exit_description() if server is not None and not server.alive() else ""
                rt = "timeout" if "timed out" in str(exc) else "server_error"
                obs = {
                    "tool_name": tool_name,
                    "reward_type": rt,
                    "done": True,
                    "error": f"environment failure: {exc}" + (f" ({why})" if why else ""),
                    "metadata": {"server_log_tail": server.log_tail(800) if server is not None else ""},
                }
                self._end(rt)
                obs["metadata"]["latency_s"] = round(time.perf_counter() - t0, 4)
                return self._record(tool_name, arguments, obs, extra)
            if out.is_error:
                obs = {
                    "tool_name": tool_name,
                    "error": out.text,
                    "done": False,
                    "metadata": {},
                    "reward_type": classify_tool_error(out.text, known_tool=known),
                }
            else:
                obs = {
                    "tool_name": tool_name,
                    "tool_result": out.text,
                    "reward_type": "tool_call_ok",
                    "done": False,
                    "metadata": {},
                }
        obs["metadata"]["latency_s"] = round(time.perf_counter() - t0, 4)
        if obs["reward_type"] in FORMAT_ERRORS:
            if self.runtime.format_error_ends_episode:
                obs["done"] = True
                self._end(obs["reward_type"])
            self.format_errors += 1
        return self._record(tool_name, arguments, obs, extra)

    def verify(self, final_answer: str | None = None) -> dict[str, Any]:
        """Run the task's verifier on the current database; ends the episode with its reward."""
        args: dict[str, Any] = {"verifier_mode": self.runtime.verifier_mode}
        if final_answer is not None:
            args["final_answer"] = final_answer
        if self.done:
            obs = {
                "tool_name": "verify",
                "error": "the episode has ended; start a new episode",
                "reward_type": "episode_already_done",
                "done": True,
                "metadata": {},
            }
            return self._record("verify", args, obs)
        outcome = self.runtime.run_verifier(
            self.task_idx, final_answer=final_answer, task=self.task, trajectory=self.steps
        )
        self._end(outcome.reward_type)
        obs = {
            "tool_name": "verify",
            "verify_result": outcome.verify_result,
            "reward_type": outcome.reward_type,
            "done": True,
            "metadata": {"latency_s": round(outcome.seconds, 4)},
        }
        self._record("verify", args, obs)
        self._verify_step = self.steps[-1]
        return obs

    def end_without_verifying(self, reason: str = "stopped") -> None:
        """Stop here with the 'other' reward (e.g. stopping early with verification disabled)."""
        if not self.done:
            self._end(reason)

    def close(self) -> None:
        self.session.close()

    def record(self, verify_turn: str = "env_output") -> dict[str, Any]:
        """The episode in the OpenEnv capture shape (plus provenance under ``metadata``).

        Where the verifier step goes: a turn of the conversation (``env_output``, as OpenEnv's
        RFC 010 example maps ``verify_result``), or, with ``"omit"``, out of ``steps`` to
        ``verification`` (the official AWM agent never shows the verifier to the policy), the
        agent's answer then kept as ``final_answer``. The reward is the same either way.
        """
        rt = self.runtime
        record: dict[str, Any] = {
            "scenario": self.scenario,
            "task": self.task,
            "task_idx": self.task_idx if self.task_idx is not None else -1,
            "tools": rt.tools,
            **verify_turn_fields(self.steps, self._verify_step, verify_turn),
            "reward": self.reward if self.reward is not None else rt.rewards.other,
            "reward_type": self.reward_type or "unfinished",
            "metadata": {
                "source": "echo-trl capture (local AWM runtime)",
                "containment": rt.containment.applied(),
                "notes": self.notes,
                "scenario_sources": rt.scenario.sources,
                "format_errors": self.format_errors,
                "verifier_reward": self.verifier_reward,
            },
        }
        if self.behavior_logprobs is not None:
            record["behavior_logprobs"] = self.behavior_logprobs
        return record


def verify_turn_fields(
    steps: list[dict[str, Any]], verify_step: dict[str, Any] | None, verify_turn: str
) -> dict[str, Any]:
    """A record's ``steps`` (and ``verification`` / ``final_answer`` when the verifier turn is omitted)."""
    if verify_turn not in VERIFY_TURNS:
        raise ValueError(f"verify_turn must be one of {VERIFY_TURNS}, got {verify_turn!r}")
    if verify_turn == "env_output" or verify_step is None:
        return {"steps": steps}
    out = {"steps": [s for s in steps if s is not verify_step], "verification": verify_step}
    answer = verify_step["action"]["arguments"].get("final_answer")
    return out if answer is None else {**out, "final_answer": answer}
