"""Recorded Agent World Model (AWM) episodes as role-tagged trajectories.

Two recorded shapes are accepted (both are plain JSON, one episode per object):

* the OpenEnv capture shape (what ``agent_world_model_env`` clients record and what
  ``echo-trl capture`` writes)::

      {scenario, task, task_idx, tools, reward,
       steps: [{action: {tool_name, arguments},
                observation: {tool_result | error | verify_result, warning, reward_type, done, ...}}]}

* the AWM server's session artifact ``trajectory.json``::

      {scenario, task, task_idx, steps: int,
       trajectory: [{action: list_tools | call_tool | verify, tool_name, arguments, success,
                     result, error, reward_type, reward, verify_result}]}

Both become the same recorded steps (:class:`~echo_trl.data.readers.awm_agent.RecordedStep`), rendered in
the chat-template format here or in the official AWM agent's (:mod:`echo_trl.data.readers.awm_agent`).
Which reader a record goes to, and reading whole files, is :mod:`echo_trl.data.readers.records`.
"""

from __future__ import annotations

from typing import Any

from ...errors import EpisodeError
from ...roles import Trajectory, tool_call
from . import awm_agent
from .awm_agent import RecordedStep
from .fields import behavior_logprobs, expect, finite, int64, required
from .prompt import DEFAULT_SYSTEM_PROMPT, prompt_messages
from .tools import output_text, tool_arguments, tool_schemas

#: AWM's reward for each ``reward_type`` when an episode carries no explicit reward.
AWM_REWARDS = {"complete": 1.0, "incomplete": 0.1, "format_error": -1.0}


def _warnings(value: Any, field: str) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    expect(value, list, field, "a string or a list of strings")
    for i, w in enumerate(value):
        expect(w, str, f"{field}[{i}]", "a string")
    return [w for w in value if w]


def _openenv_steps(steps: Any) -> list[RecordedStep]:
    expect(steps, list, "steps", "a list of steps")
    out = []
    for i, step in enumerate(steps):
        here = f"steps[{i}]"
        expect(step, dict, here, "an object with action and observation")
        action = expect(required(step, "action", here), dict, f"{here}.action", "an object")
        observation = expect(required(step, "observation", here), dict, f"{here}.observation", "an object")
        name = expect(required(action, "tool_name", f"{here}.action"), str, f"{here}.action.tool_name", "a string")
        if not name:
            raise EpisodeError("expected a non-empty tool name", field=f"{here}.action.tool_name")
        args = tool_arguments(action.get("arguments"), f"{here}.action.arguments")
        parts = [
            output_text(observation[k], f"{here}.observation.{k}")
            for k in ("tool_result", "error", "verify_result")
            if observation.get(k) is not None
        ]
        if not parts:
            raise EpisodeError("expected one of tool_result, error, verify_result", field=f"{here}.observation")
        out.append(
            RecordedStep(
                name,
                args,
                "\n".join(parts),
                _warnings(observation.get("warning"), f"{here}.observation.warning"),
                error=observation.get("error") is not None and observation.get("tool_result") is None,
                verify=name == "verify" and observation.get("verify_result") is not None,
            )
        )
    return out


def _session_steps(entries: Any) -> tuple[list[RecordedStep], list[Any], float | None]:
    """Steps, tools advertised by ``list_tools`` and the last recorded reward of a trajectory.json."""
    expect(entries, list, "trajectory", "a list of steps")
    steps, tools, reward = [], [], None
    for i, entry in enumerate(entries):
        here = f"trajectory[{i}]"
        expect(entry, dict, here, "an object")
        kind = expect(required(entry, "action", here), str, f"{here}.action", "a string")
        if entry.get("reward") is not None:
            reward = finite(entry["reward"], f"{here}.reward")
        if kind == "list_tools":
            # The harness showing the agent its tools: context (the tool schemas), not a turn.
            listed = entry.get("result")
            if isinstance(listed, dict):
                listed = listed.get("tools")
            tools = expect(listed if listed is not None else [], list, f"{here}.result", "a list of tools")
            continue
        if kind not in ("call_tool", "verify"):
            raise EpisodeError(
                f"unknown action {kind!r} (expected list_tools, call_tool or verify)", field=f"{here}.action"
            )
        name = entry.get("tool_name") or ("verify" if kind == "verify" else None)
        expect(name, str, f"{here}.tool_name", "a string")
        args = tool_arguments(entry.get("arguments"), f"{here}.arguments")
        failed = kind != "verify" and (
            entry.get("success") is False or (entry.get("error") is not None and entry.get("result") is None)
        )
        if kind == "verify":
            key = "verify_result" if "verify_result" in entry else "result"
        elif failed:
            key = "error"
        else:
            key = "result"
        value = entry.get(key)
        if value is None:
            raise EpisodeError("missing observation", field=f"{here}.{'verify_result' if kind == 'verify' else key}")
        steps.append(
            RecordedStep(
                name,
                args,
                output_text(value, f"{here}.{key}"),
                _warnings(entry.get("warning"), f"{here}.warning"),
                error=failed,
                verify=kind == "verify",
            )
        )
    return steps, tools, reward


def _final_answer(steps: list[RecordedStep], episode: dict[str, Any]) -> str | None:
    """The agent's answer: given to the verifier (``final_answer``) or recorded beside the steps."""
    answer = next(
        (s.arguments["final_answer"] for s in steps if s.verify and isinstance(s.arguments.get("final_answer"), str)),
        episode.get("final_answer"),
    )
    return None if answer is None else expect(answer, str, "final_answer", "a string")


def awm_record_to_trajectory(
    episode: Any,
    *,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
    format: str = "chat-template",
    verify_turn: str = "env_output",
) -> Trajectory:
    """One recorded AWM episode (either shape) as a :class:`Trajectory` in ``format``.

    Raises :class:`EpisodeError` naming the field; :func:`echo_trl.data.readers.records.awm_episode_to_trajectory`
    checks the options and the text first and names the file and record.
    """
    expect(episode, dict, "", "an episode object")
    scenario = expect(required(episode, "scenario", ""), str, "scenario", "a string")
    task = expect(required(episode, "task", ""), str, "task", "a string")
    if not task.strip():
        raise EpisodeError("expected a non-empty task", field="task")
    task_idx = int64(required(episode, "task_idx", ""), "task_idx")

    reward, listed = None, None
    if "trajectory" in episode:
        steps, listed, reward = _session_steps(episode["trajectory"])
    elif "steps" in episode:
        steps = _openenv_steps(episode["steps"])
    else:
        raise EpisodeError("missing (expected steps or trajectory)", field="steps")
    recorded_tools = episode.get("tools") if episode.get("tools") is not None else listed
    tools = tool_schemas(recorded_tools, compact=compact_tools)  # checked in either format
    if not steps and episode.get("final_answer") is None:  # an answer without any call is a (poor) episode
        raise EpisodeError(
            "episode has no tool calls and no final_answer", field="trajectory" if "trajectory" in episode else "steps"
        )

    if episode.get("reward") is not None:
        reward = finite(episode["reward"], "reward")
    if reward is None:
        reward_type = episode.get("reward_type") or ""
        if reward_type not in AWM_REWARDS:
            raise EpisodeError("missing (and no reward_type to derive it from)", field="reward")
        reward = AWM_REWARDS[reward_type]
    final_answer = _final_answer(steps, episode)
    logprobs = behavior_logprobs(episode.get("behavior_logprobs"))
    if format == "awm-agent":
        return awm_agent.to_awm_agent_trajectory(
            task=task,
            tools=awm_agent.listed_tools(recorded_tools),
            steps=steps,
            reward=reward,
            scenario=scenario,
            task_idx=task_idx,
            final_answer=final_answer,
            verify_turn=verify_turn,
            behavior_logprobs=logprobs,
            system_prompt=awm_agent.SYSTEM_PROMPT if system_prompt == DEFAULT_SYSTEM_PROMPT else system_prompt,
        )
    if verify_turn == "omit":
        steps = [s for s in steps if not s.verify]
    completion, warnings = [], []
    for step in steps:
        completion.append(
            {"role": "assistant", "content": "", "tool_calls": [tool_call(step.tool_name, dict(step.arguments))]}
        )
        warnings.append([])
        completion.append({"role": "tool", "name": step.tool_name, "content": step.output})
        warnings.append(list(step.warnings))
    if verify_turn == "omit" and final_answer is not None:
        completion.append({"role": "assistant", "content": final_answer})
        warnings.append([])
    return Trajectory(
        prompt=prompt_messages(system_prompt, scenario, task),
        completion=completion,
        tools=tools,
        warnings=warnings,
        reward=reward,
        scenario=scenario,
        task_idx=task_idx,
        behavior_logprobs=logprobs,
    )
