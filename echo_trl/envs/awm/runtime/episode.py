"""A running AWM scenario (:class:`AWMRuntime`) and its episodes (:class:`Episode`).

The runtime owns one private temp directory, the initial database image built from schema +
samples, and one contained scenario server, whose live database exists only in its sandbox.
Episodes reuse the server: ``new_episode`` has the server restore its live database from the
snapshot (SQLite backup API, milliseconds; a server that cannot is restarted) and opens a fresh
MCP session. Every step becomes an observation in the OpenEnv capture shape that
``echo_trl.data.readers.records.load_awm_episodes`` reads::

    {"action": {"tool_name": str, "arguments": dict},
     "observation": {"tool_name", "tool_result" | "error" | "verify_result", "warning",
                     "reward_type", "done", "metadata"}}

``reward_type`` and reward per step are the upstream OpenEnv server's (:mod:`~echo_trl.envs.awm.scenario.rewards`):
``tool_call_ok``; ``tool_not_found`` / ``invalid_args`` (format errors, -1.0; an HTTP 404 of an
existing tool counts as ``tool_not_found``, as upstream classifies it); ``timeout`` /
``server_error``; for the ``verify`` step the verifier's outcome (``complete``, ``others``,
``judge_error``, ``no_verifier``). Each step keeps its reward beside the observation, and the
verify observation has upstream's shape (no ``tool_name``, a three-key ``verify_result``, or an
``error`` where there is no verifier). A server that dies or hangs ends the episode here
(``server_error`` / ``timeout``); the upstream server would answer every later call the same.

Format errors follow AWM's semantics by default: the episode goes on (the official agent and
OpenEnv's AWM environment let the agent recover), and its reward stays the format-error reward
(-1.0) however it ends; the verifier's own reward is kept as ``verifier_reward``.
``format_error_ends_episode=True`` restores the stricter rule (end at the first format error).

Cleanup is unconditional: ``close()`` (also via ``with``, ``atexit`` and garbage collection)
kills the server's process group and removes the temp directory, whatever happened; no file in
it was written by generated code.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from ....clients.mcp import CallTimedOut, MCPError, MCPSession
from ....data.readers.formats import VERIFY_TURNS
from ....sandbox import bwrap, hostio
from ..scenario.database import BuildReport, build_image
from ..scenario.rewards import (
    FORMAT_ERRORS,
    classify_tool_error,
    episode_outcome,
    step_reward,
    verify_observation,
)
from ..scenario.source import Scenario
from .server import DatabaseUnavailable, ScenarioServer
from .settings import AWMSettings
from .verifier import VerifyOutcome, verify_databases

#: What a step after the end of the episode answers.
ENDED = "the episode has ended; start a new episode"


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
        settings: AWMSettings | None = None,
        format_error_ends_episode: bool = False,
        containment: bwrap.Containment | None = None,
        keep_dir: bool = False,
        **options: Any,
    ):
        """``settings`` (:class:`~echo_trl.envs.awm.runtime.settings.AWMSettings`: timeouts, verifier, rewards,
        sandbox); ``options`` change single fields of it (``AWMRuntime(scenario, tool_timeout=60)``)."""
        settings = (settings or AWMSettings()).replace(**options)
        self.scenario = scenario
        self.tool_timeout, self.verifier_timeout = settings.tool_timeout, settings.verifier_timeout
        self.verifier_mode, self.judge = settings.verifier_mode, settings.judge
        self.rewards = settings.rewards
        self.format_error_ends_episode = format_error_ends_episode
        # Refuses (ContainmentUnavailable) unless bwrap works here or the caller explicitly opted out.
        self.containment = containment or bwrap.require_containment(settings.unsafe_no_sandbox)
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

    @property
    def scenario(self) -> str:
        return self.runtime.scenario.name

    def _record(
        self, tool_name: str, arguments: Any, observation: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        step: dict[str, Any] = {"action": {"tool_name": tool_name, "arguments": arguments}, "observation": observation}
        if observation["reward_type"] != "episode_already_done":  # upstream gives no reward there
            step["reward"] = step_reward(observation["reward_type"], self.runtime.rewards)
        if extra:
            step.update(extra)
        self.steps.append(step)
        return observation

    def _end(self, reward_type: str) -> None:
        """End the episode; any format error on the way keeps the reward at the format-error reward."""
        self.done = True
        self.verifier_reward = step_reward(reward_type, self.runtime.rewards)
        self.reward_type, self.reward = episode_outcome(
            reward_type, self.verifier_reward, self.format_errors, self.runtime.rewards
        )

    def _ended(self, tool_name: str, arguments: Any, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        obs = {"reward_type": "episode_already_done", "error": ENDED, "done": True, "metadata": {}}
        return self._record(tool_name, arguments, obs, extra)

    def call_tool(
        self, tool_name: str, arguments: Any = None, *, extra: dict[str, Any] | None = None, refuse: str | None = None
    ) -> dict[str, Any]:
        """Call one scenario tool over MCP and record the step; returns the observation.

        ``refuse``: the harness rejects the call itself with this error (an unknown tool, no
        server asked): recorded as ``tool_not_found`` under the same format-error rule.
        Arguments that are not a JSON object are ``invalid_args`` (an OpenEnv server refuses
        such a message outright).
        """
        arguments = {} if arguments is None else arguments
        if self.done:
            return self._ended(tool_name, arguments, extra)
        t0 = time.perf_counter()
        head = {"tool_name": tool_name}
        if refuse is not None:
            obs = {"reward_type": "tool_not_found", **head, "error": refuse}
        elif not isinstance(arguments, dict):
            why = f"tool arguments must be a JSON object, got {type(arguments).__name__}"
            obs = {"reward_type": "invalid_args", **head, "error": why}
            arguments = {"_raw": arguments}
        else:
            try:
                out = self.session.call_tool(tool_name, arguments, timeout=self.runtime.tool_timeout)
            except MCPError as exc:
                server = self.runtime.server
                if isinstance(exc, CallTimedOut) and server is not None:
                    server.stop()  # a call still computing would burn CPU through later episodes: the next starts anew
                    self.notes.append(
                        f"tool call {tool_name!r} timed out after {self.runtime.tool_timeout:g}s: its scenario server "
                        "was stopped (no CPU spent on it after the timeout) and is restarted for the next call"
                    )
                why = server.exit_description() if server is not None and not server.alive() else ""
                rt = "timeout" if "timed out" in str(exc) else "server_error"
                obs = {
                    "reward_type": rt,
                    **head,
                    "error": f"environment failure: {exc}" + (f" ({why})" if why else ""),
                    "done": True,
                    "metadata": {"server_log_tail": server.log_tail(800) if server is not None else ""},
                }
                self._end(rt)
                obs["metadata"]["latency_s"] = round(time.perf_counter() - t0, 4)
                return self._record(tool_name, arguments, obs, extra)
            if out.is_error:
                obs = {"reward_type": classify_tool_error(out.text), **head, "error": out.text}
            else:
                obs = {"reward_type": "tool_call_ok", **head, "tool_result": out.text}
        obs.update(done=False, metadata={"latency_s": round(time.perf_counter() - t0, 4)})
        if obs["reward_type"] in FORMAT_ERRORS:
            self.format_errors += 1
            if self.runtime.format_error_ends_episode:
                obs["done"] = True
                self._end(obs["reward_type"])
        return self._record(tool_name, arguments, obs, extra)

    def verify(self, final_answer: str | None = None) -> dict[str, Any]:
        """Run the task's verifier on the current database; ends the episode with its reward.

        ``steps_taken`` counts the tool listing an episode starts with, as an OpenEnv server
        counts the ``list_tools`` step of a client that lists tools once.
        """
        mode = self.runtime.verifier_mode
        args: dict[str, Any] = {"verifier_mode": mode}
        if final_answer is not None:
            args["final_answer"] = final_answer
        if self.done:
            return self._ended("verify", args)
        outcome = self.runtime.run_verifier(
            self.task_idx, final_answer=final_answer, task=self.task, trajectory=self.steps
        )
        obs, details = verify_observation(
            outcome.reward_type,
            outcome.verify_result,
            scenario=self.scenario,
            task=self.task,
            task_idx=self.task_idx,
            steps_taken=len(self.steps) + 2,
            verifier_mode=mode,
        )
        self._end(obs["reward_type"])
        obs.update(done=True, metadata={"latency_s": round(outcome.seconds, 4), **details})
        self._record("verify", args, obs)
        self._verify_step = self.steps[-1]
        return obs

    def end_without_verifying(self, reason: str = "stopped") -> None:
        """Stop here without the verifier: reward 0.0, or the format-error reward after a format error."""
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
