"""Read recorded Agent World Model (AWM) episodes and map them onto role-tagged trajectories.

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

Finding files and reading their records is :mod:`echo_trl.data.episode_files`; this module turns
each record into a trajectory, naming the field of anything it cannot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EpisodeError
from ..roles import Trajectory, tool_call
from . import awm_agent
from .awm_agent import FORMATS, VERIFY_TURNS, default_verify_turn
from .episode_files import (  # noqa: F401  (re-exported: the reading layer's public names)
    EPISODE_SUFFIXES,
    EpisodeRecord,
    find_episode_files,
    is_episode_file,
    iter_episode_records,
    parse_json,
)

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent operating in the '{scenario}' environment. Use the available tools to "
    "complete the user's task. Call one tool at a time and read its result before the next call."
)

#: AWM's reward for each ``reward_type`` when an episode carries no explicit reward.
AWM_REWARDS = {"complete": 1.0, "incomplete": 0.1, "format_error": -1.0}


@dataclass(frozen=True)
class SkippedRecord:
    """A record lenient loading left out, and why (written to ``skipped.jsonl``)."""

    source: str
    record: str
    reason: str
    raw: Any

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "record": self.record, "reason": self.reason, "raw": self.raw}

    def to_jsonl(self) -> str:
        """One ``skipped.jsonl`` line, for any record: text that is not valid Unicode is escaped
        (``\\ud800``), a value too deep to write again is left out (its reason says why)."""
        try:
            line = json.dumps(self.to_json(), ensure_ascii=False)
        except (RecursionError, ValueError, TypeError):
            return json.dumps({**self.to_json(), "raw": None}, ensure_ascii=True)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(self.to_json(), ensure_ascii=True)
        return line


# --------------------------------------------------------------------------------------------
# Field validation helpers (each names the field path it checks)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


def _expect(value: Any, kinds: type | tuple[type, ...], field: str, what: str) -> Any:
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise EpisodeError(f"expected {what}, got {_type_name(value)}", field=field)
    if not isinstance(value, kinds):
        raise EpisodeError(f"expected {what}, got {_type_name(value)}", field=field)
    return value


def _finite(value: Any, field: str) -> float:
    _expect(value, (int, float), field, "a number")
    try:
        number = float(value)  # an integer like 10**400 has no float: OverflowError
    except OverflowError:
        raise EpisodeError("number out of range (an integer too large for a float)", field=field) from None
    if not math.isfinite(number):
        raise EpisodeError(f"expected a finite number, got {value}", field=field)
    return number


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int64(value: Any, field: str) -> int:
    """An integer the dataset's ``int64`` column can hold (Arrow raises OverflowError otherwise)."""
    _expect(value, int, field, "an integer")
    if not INT64_MIN <= value <= INT64_MAX:
        raise EpisodeError("integer out of range (the dataset stores a 64-bit integer)", field=field)
    return value


def _child(field: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{field}[{key}]"
    return f"{field}.{key}" if field else str(key)


def check_text(value: Any, field: str = "") -> None:
    """Raise :class:`EpisodeError` at the first string (key or value) that is not valid Unicode.

    JSON escapes can spell lone surrogates (``"\\ud800"``); Python keeps them, but no UTF-8
    writer (Arrow, a file, a tokenizer) can, so one would fail the whole build far from its
    record. Iterative, so depth is no problem.
    """
    try:  # fast path, in C: only a record that fails it is walked to name the field
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return
    except (UnicodeEncodeError, RecursionError, TypeError, ValueError):
        pass
    stack = [(value, field)]
    while stack:
        item, here = stack.pop()
        if isinstance(item, str):
            _utf8(item, here)
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str):
                    _utf8(key, f"{here} (a key)" if here else "(a key)")
                stack.append((sub, _child(here, key)))
        elif isinstance(item, list):
            stack.extend((sub, _child(here, i)) for i, sub in enumerate(item))


def _utf8(text: str, field: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise EpisodeError(
            f"lone surrogate {ascii(bad)} at character {exc.start} is not valid Unicode text", field=field or None
        ) from None


def _required(obj: dict[str, Any], key: str, field: str) -> Any:
    if key not in obj:
        raise EpisodeError("missing", field=f"{field}.{key}" if field else key)
    return obj[key]


def serialize_output(value: Any) -> str:
    """Environment output as text: strings verbatim, anything else as deterministic JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2)


def _output_text(value: Any, field: str) -> str:
    try:
        return serialize_output(value)
    except RecursionError:
        raise EpisodeError("nested too deeply to serialise", field=field) from None
    except (TypeError, ValueError) as exc:  # Python objects given through the API, not JSON
        raise EpisodeError(f"not JSON-serialisable ({exc})", field=field) from None


def _arguments(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = parse_json(value) if value.strip() else {}
        except ValueError as exc:
            raise EpisodeError(f"arguments string is not valid JSON ({exc})", field=field) from None
        except RecursionError:
            raise EpisodeError("arguments string is not valid JSON (nested too deeply)", field=field) from None
        check_text(value, field)
    return _expect(value, dict, field, "an object of tool arguments")


def _warnings(value: Any, field: str) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    _expect(value, list, field, "a string or a list of strings")
    for i, w in enumerate(value):
        _expect(w, str, f"{field}[{i}]", "a string")
    return [w for w in value if w]


def tool_schema(tool: Any, field: str = "tools[0]") -> dict[str, Any]:
    """A tool as the JSON schema chat templates take, from a name, an MCP tool or an OpenAI tool."""
    if isinstance(tool, str):
        if not tool:
            raise EpisodeError("expected a non-empty tool name", field=field)
        return {
            "type": "function",
            "function": {"name": tool, "description": "", "parameters": {"type": "object", "properties": {}}},
        }
    _expect(tool, dict, field, "a tool name or a tool object")
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        name = tool["function"].get("name")
        _expect(name, str, f"{field}.function.name", "a string")
        return tool
    name = _expect(_required(tool, "name", field), str, f"{field}.name", "a string")
    description = tool.get("description") or ""
    _expect(description, str, f"{field}.description", "a string")
    params = tool.get("inputSchema", tool.get("input_schema", tool.get("parameters")))
    if params is None:
        params = {"type": "object", "properties": {}}
    _expect(params, dict, f"{field}.inputSchema", "a JSON schema object")
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def compact_tool_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without the response documentation fastapi-mcp appends to each description.

    AWM serves its tools through fastapi-mcp, which appends ``### Responses:`` (status codes,
    example JSON) to every description: most of the prompt of an AWM episode. The agent needs
    the summary and the input schema; the answer format it learns from the tool outputs.
    """
    fn = schema["function"]
    description = fn.get("description") or ""
    cut = description.find("\n\n### ")
    if cut == -1:
        return schema
    return {**schema, "function": {**fn, "description": description[:cut].rstrip()}}


def _tools(value: Any, field: str = "tools", compact: bool = False) -> list[dict[str, Any]]:
    if value is None:
        return []
    _expect(value, list, field, "a list of tool names or tool objects")
    schemas = [tool_schema(t, f"{field}[{i}]") for i, t in enumerate(value)]
    return [compact_tool_schema(s) for s in schemas] if compact else schemas


def _behavior_logprobs(value: Any) -> list[float] | None:
    if value is None:
        return None
    _expect(value, list, "behavior_logprobs", "a list of numbers")
    return [_finite(v, f"behavior_logprobs[{i}]") for i, v in enumerate(value)]


# --------------------------------------------------------------------------------------------
# Episode -> trajectory


@dataclass
class _Turn:
    name: str
    arguments: dict[str, Any]
    output: str
    warnings: list[str]
    error: bool = False  # the call failed (the output is the error text)
    verify: bool = False  # the verifier step, not a scenario tool call


def _openenv_turns(steps: Any) -> list[_Turn]:
    _expect(steps, list, "steps", "a list of steps")
    turns = []
    for i, step in enumerate(steps):
        here = f"steps[{i}]"
        _expect(step, dict, here, "an object with action and observation")
        action = _expect(_required(step, "action", here), dict, f"{here}.action", "an object")
        observation = _expect(_required(step, "observation", here), dict, f"{here}.observation", "an object")
        name = _expect(_required(action, "tool_name", f"{here}.action"), str, f"{here}.action.tool_name", "a string")
        if not name:
            raise EpisodeError("expected a non-empty tool name", field=f"{here}.action.tool_name")
        args = _arguments(action.get("arguments"), f"{here}.action.arguments")
        parts = [
            _output_text(observation[k], f"{here}.observation.{k}")
            for k in ("tool_result", "error", "verify_result")
            if observation.get(k) is not None
        ]
        if not parts:
            raise EpisodeError("expected one of tool_result, error, verify_result", field=f"{here}.observation")
        turns.append(
            _Turn(
                name,
                args,
                "\n".join(parts),
                _warnings(observation.get("warning"), f"{here}.observation.warning"),
                error=observation.get("error") is not None and observation.get("tool_result") is None,
                verify=name == "verify" and observation.get("verify_result") is not None,
            )
        )
    return turns


def _session_turns(entries: Any) -> tuple[list[_Turn], list[Any], float | None]:
    """Turns, tools advertised by ``list_tools`` and the last recorded reward of a trajectory.json."""
    _expect(entries, list, "trajectory", "a list of steps")
    turns, tools, reward = [], [], None
    for i, entry in enumerate(entries):
        here = f"trajectory[{i}]"
        _expect(entry, dict, here, "an object")
        kind = _expect(_required(entry, "action", here), str, f"{here}.action", "a string")
        if entry.get("reward") is not None:
            reward = _finite(entry["reward"], f"{here}.reward")
        if kind == "list_tools":
            # The harness showing the agent its tools: context (the tool schemas), not a turn.
            listed = entry.get("result")
            if isinstance(listed, dict):
                listed = listed.get("tools")
            tools = _expect(listed if listed is not None else [], list, f"{here}.result", "a list of tools")
            continue
        if kind not in ("call_tool", "verify"):
            raise EpisodeError(
                f"unknown action {kind!r} (expected list_tools, call_tool or verify)", field=f"{here}.action"
            )
        name = entry.get("tool_name") or ("verify" if kind == "verify" else None)
        _expect(name, str, f"{here}.tool_name", "a string")
        args = _arguments(entry.get("arguments"), f"{here}.arguments")
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
        turns.append(
            _Turn(
                name,
                args,
                _output_text(value, f"{here}.{key}"),
                _warnings(entry.get("warning"), f"{here}.warning"),
                error=failed,
                verify=kind == "verify",
            )
        )
    return turns, tools, reward


def awm_episode_to_trajectory(
    episode: Any,
    *,
    source: str = "<episode>",
    record: str | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
    format: str = "chat-template",
    verify_turn: str | None = None,
) -> Trajectory:
    """Map one recorded AWM episode (either shape) onto a role-tagged :class:`Trajectory`.

    System prompt and task become the prompt (``context``); each step becomes an assistant
    message with one tool call (``action``) followed by a ``tool`` message holding the tool
    result, error or verifier output (``env_output``). Harness warnings go to
    ``Trajectory.warnings``, never into the tool message text. ``compact_tools`` drops the
    response documentation from tool descriptions (:func:`compact_tool_schema`). Raises
    :class:`EpisodeError` naming ``source``, ``record`` and the offending field.

    ``format="awm-agent"``: the official AWM agent's conversation (:mod:`echo_trl.data.awm_agent`).
    ``verify_turn`` (``env_output`` | ``omit``, default per format) keeps or drops the verifier
    step (dropped: a recorded final answer ends the chat). A record with ``messages`` (a
    conversation log) is read as recorded by :mod:`echo_trl.data.conversations`.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})")
    if verify_turn not in (None, *VERIFY_TURNS):
        raise ValueError(f"unknown verify_turn {verify_turn!r} (expected one of {', '.join(VERIFY_TURNS)})")
    if compact_tools and format == "awm-agent":
        raise ValueError(
            "compact_tools applies to the chat-template format (awm-agent lists tools as the official agent does)"
        )
    from .conversations import conversation_to_trajectory, is_conversation

    try:
        check_text(episode)
        if is_conversation(episode):
            return conversation_to_trajectory(episode, source=source, record_id=record)
        return _convert(episode, system_prompt, compact_tools, format, verify_turn or default_verify_turn(format))
    except EpisodeError as exc:
        raise exc.at(source=source, record=record) from None
    except (RecursionError, OverflowError, TypeError, ValueError) as exc:
        # A backstop: content the checks above did not foresee is still this record's error.
        raise EpisodeError(f"cannot convert ({type(exc).__name__}: {exc})", source=source, record=record) from None


def _final_answer(turns: list[_Turn], episode: dict[str, Any]) -> str | None:
    """The agent's answer: given to the verifier (``final_answer``) or recorded beside the steps."""
    answer = next(
        (t.arguments["final_answer"] for t in turns if t.verify and isinstance(t.arguments.get("final_answer"), str)),
        episode.get("final_answer"),
    )
    return None if answer is None else _expect(answer, str, "final_answer", "a string")


def _convert(
    episode: Any,
    system_prompt: str | None,
    compact_tools: bool = False,
    format: str = "chat-template",
    verify_turn: str = "env_output",
) -> Trajectory:
    _expect(episode, dict, "", "an episode object")
    scenario = _expect(_required(episode, "scenario", ""), str, "scenario", "a string")
    task = _expect(_required(episode, "task", ""), str, "task", "a string")
    if not task.strip():
        raise EpisodeError("expected a non-empty task", field="task")
    task_idx = _int64(_required(episode, "task_idx", ""), "task_idx")

    reward, listed = None, None
    if "trajectory" in episode:
        turns, listed, reward = _session_turns(episode["trajectory"])
        tools = _tools(episode.get("tools") if episode.get("tools") is not None else listed, compact=compact_tools)
    elif "steps" in episode:
        turns = _openenv_turns(episode["steps"])
        tools = _tools(episode.get("tools"), compact=compact_tools)
    else:
        raise EpisodeError("missing (expected steps or trajectory)", field="steps")
    if not turns and episode.get("final_answer") is None:  # an answer without any call is a (poor) episode
        raise EpisodeError(
            "episode has no tool calls and no final_answer", field="trajectory" if "trajectory" in episode else "steps"
        )

    if episode.get("reward") is not None:
        reward = _finite(episode["reward"], "reward")
    if reward is None:
        reward_type = episode.get("reward_type") or ""
        if reward_type not in AWM_REWARDS:
            raise EpisodeError("missing (and no reward_type to derive it from)", field="reward")
        reward = AWM_REWARDS[reward_type]
    final_answer = _final_answer(turns, episode)
    logprobs = _behavior_logprobs(episode.get("behavior_logprobs"))
    if format == "awm-agent":
        steps = [awm_agent.RecordedStep(t.name, t.arguments, t.output, t.warnings, t.error, t.verify) for t in turns]
        return awm_agent.to_awm_agent_trajectory(
            task=task,
            tools=awm_agent.listed_tools(episode.get("tools") if episode.get("tools") is not None else listed),
            steps=steps,
            reward=reward,
            scenario=scenario,
            task_idx=task_idx,
            final_answer=final_answer,
            verify_turn=verify_turn,
            behavior_logprobs=logprobs,
            system_prompt=awm_agent.SYSTEM_PROMPT
            if system_prompt == DEFAULT_SYSTEM_PROMPT
            else system_prompt and system_prompt.replace("{scenario}", scenario),
        )
    if verify_turn == "omit":
        turns = [t for t in turns if not t.verify]

    prompt = []
    if system_prompt:
        prompt.append({"role": "system", "content": system_prompt.replace("{scenario}", scenario)})
    prompt.append({"role": "user", "content": task})
    completion, warnings = [], []
    for turn in turns:
        completion.append({"role": "assistant", "content": "", "tool_calls": [tool_call(turn.name, turn.arguments)]})
        warnings.append([])
        completion.append({"role": "tool", "name": turn.name, "content": turn.output})
        warnings.append(turn.warnings)
    if verify_turn == "omit" and final_answer is not None:
        completion.append({"role": "assistant", "content": final_answer})
        warnings.append([])
    return Trajectory(
        prompt=prompt,
        completion=completion,
        tools=tools,
        warnings=warnings,
        reward=reward,
        scenario=scenario,
        task_idx=task_idx,
        behavior_logprobs=logprobs,
    )


def load_awm_episodes(
    inputs: Iterable[str | Path],
    *,
    strict: bool = True,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
    show_progress: bool | None = False,
    check: Callable[[Trajectory], None] | None = None,
    format: str = "chat-template",
    verify_turn: str | None = None,
) -> tuple[list[Trajectory], list[SkippedRecord]]:
    """Read and convert every episode under ``inputs``.

    ``strict=True`` raises the first :class:`EpisodeError`; ``strict=False`` keeps every valid
    episode and returns the rejected records with their reasons (nothing valid is lost).
    ``check`` runs on each converted trajectory inside its record's error handling (the dataset
    builder passes its Arrow encoder), so an :class:`EpisodeError` it raises names this record.
    Input that yields no episode at all is an error in both modes.
    ``format`` and ``verify_turn``: see :func:`awm_episode_to_trajectory`.
    """
    from ..progress import progress

    inputs = list(inputs)
    trajectories, skipped = [], []
    for rec in progress(iter_episode_records(inputs), desc="episodes", unit="ep", enable=show_progress):
        try:
            if rec.error is not None:
                raise rec.error
            trajectory = awm_episode_to_trajectory(
                rec.data,
                source=rec.source,
                record=rec.record or None,
                system_prompt=system_prompt,
                compact_tools=compact_tools,
                format=format,
                verify_turn=verify_turn,
            )
            if check is not None:
                check(trajectory)
            trajectories.append(trajectory)
        except EpisodeError as exc:
            exc = exc.at(source=rec.source, record=rec.record or None)
            if strict:
                raise exc from None
            skipped.append(SkippedRecord(rec.source, rec.record, str(exc), rec.data if rec.error is None else rec.raw))
    if not trajectories:
        where = ", ".join(map(str, inputs)) or "<no inputs>"
        detail = (
            f"all {len(skipped)} record(s) are invalid; first: {skipped[0].reason}"
            if skipped
            else "no episode records"
        )
        raise EpisodeError(f"no valid episodes ({detail})", source=where)
    return trajectories, skipped
