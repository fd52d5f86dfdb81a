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

Files may be ``.json`` (one object or a list of objects) or ``.jsonl`` (one object per line);
directories are searched recursively, in sorted order, so the same input always gives the
same episodes in the same order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import EpisodeError
from .roles import Trajectory, tool_call

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent operating in the '{scenario}' environment. Use the available tools to "
    "complete the user's task. Call one tool at a time and read its result before the next call."
)

#: AWM's reward for each ``reward_type`` when an episode carries no explicit reward.
AWM_REWARDS = {"complete": 1.0, "incomplete": 0.1, "format_error": -1.0}

EPISODE_SUFFIXES = (".json", ".jsonl")

#: Conversation formats a recorded episode can be rendered in (see ``docs/datasets.md``).
FORMATS = ("chat-template", "awm-agent")
#: How the verifier step enters the conversation: as an ``env_output`` message, or not at all.
VERIFY_TURNS = ("env_output", "omit")


def default_verify_turn(format: str) -> str:
    """``omit`` for the official agent's format (it never shows the verifier), else ``env_output``."""
    return "omit" if format == "awm-agent" else "env_output"


@dataclass(frozen=True)
class EpisodeRecord:
    """One raw record read from disk, with where it came from; ``error`` set if unreadable."""

    source: str
    record: str  # "17" for a JSONL line, "[3]" for a list index, "" for a whole-file object
    data: Any = None
    error: EpisodeError | None = None
    raw: str | None = None  # the raw text of the record, kept for the skipped report


@dataclass(frozen=True)
class SkippedRecord:
    """A record lenient loading left out, and why (written to ``skipped.jsonl``)."""

    source: str
    record: str
    reason: str
    raw: Any

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "record": self.record, "reason": self.reason, "raw": self.raw}


# --------------------------------------------------------------------------------------------
# Reading files


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not valid JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_json(text: str) -> Any:
    """Strict JSON: duplicated keys and NaN/Infinity are errors, not silent last-one-wins."""
    return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)


def _collect_metadata(path: Path) -> bool:
    """``openenv collect``'s run metadata (beside its ``results.jsonl``): not an episode."""
    return path.name == "metadata.json" and (path.parent / "results.jsonl").is_file()


def find_episode_files(inputs: Iterable[str | Path]) -> list[Path]:
    """Expand files and directories into a sorted, de-duplicated list of episode files."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in EPISODE_SUFFIXES
                                and p.name != "skipped.jsonl" and not _collect_metadata(p)))
        elif path.is_file():
            files.append(path)
        else:
            raise EpisodeError("no such file or directory", source=str(path))
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def iter_episode_records(inputs: Iterable[str | Path]) -> Iterator[EpisodeRecord]:
    """Yield every raw record of every input; unreadable records carry an ``error``, never raise.

    A broken line in a JSONL file does not hide the valid lines around it.
    """
    for path in find_episode_files(inputs):
        source = str(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            yield EpisodeRecord(source, "", error=EpisodeError(f"cannot read file: {exc}", source=source))
            continue
        if path.suffix == ".jsonl":
            for lineno, line in enumerate(data.split(b"\n"), start=1):
                if not line.strip():
                    continue
                yield _parse_record(line, source, str(lineno))
        else:
            rec = _parse_record(data, source, "")
            if rec.error is None and isinstance(rec.data, list):
                for i, item in enumerate(rec.data):
                    yield EpisodeRecord(source, f"[{i}]", data=item, raw=None)
            else:
                yield rec


def _parse_record(raw: bytes, source: str, record: str) -> EpisodeRecord:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        err = EpisodeError(f"invalid UTF-8 at byte {exc.start}", source=source, record=record or None)
        return EpisodeRecord(source, record, error=err, raw=raw.decode("utf-8", errors="replace"))
    try:
        return EpisodeRecord(source, record, data=parse_json(text), raw=text)
    except (ValueError, RecursionError) as exc:
        err = EpisodeError(f"invalid JSON: {exc}", source=source, record=record or None)
        return EpisodeRecord(source, record, error=err, raw=text)


# --------------------------------------------------------------------------------------------
# Field validation helpers (each names the field path it checks)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _expect(value: Any, kinds: type | tuple[type, ...], field: str, what: str) -> Any:
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise EpisodeError(f"expected {what}, got {_type_name(value)}", field=field)
    if not isinstance(value, kinds):
        raise EpisodeError(f"expected {what}, got {_type_name(value)}", field=field)
    return value


def _finite(value: Any, field: str) -> float:
    _expect(value, (int, float), field, "a number")
    if not math.isfinite(value):
        raise EpisodeError(f"expected a finite number, got {value}", field=field)
    return float(value)


def _required(obj: dict[str, Any], key: str, field: str) -> Any:
    if key not in obj:
        raise EpisodeError("missing", field=f"{field}.{key}" if field else key)
    return obj[key]


def serialize_output(value: Any) -> str:
    """Environment output as text: strings verbatim, anything else as deterministic JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2)


def _arguments(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = parse_json(value) if value.strip() else {}
        except ValueError as exc:
            raise EpisodeError(f"arguments string is not valid JSON ({exc})", field=field) from None
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
        return {"type": "function",
                "function": {"name": tool, "description": "", "parameters": {"type": "object", "properties": {}}}}
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
        parts = [serialize_output(observation[k]) for k in ("tool_result", "error", "verify_result")
                 if observation.get(k) is not None]
        if not parts:
            raise EpisodeError("expected one of tool_result, error, verify_result", field=f"{here}.observation")
        turns.append(_Turn(name, args, "\n".join(parts), _warnings(observation.get("warning"), f"{here}.observation.warning"),
                           error=observation.get("error") is not None and observation.get("tool_result") is None,
                           verify=name == "verify" and observation.get("verify_result") is not None))
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
            raise EpisodeError(f"unknown action {kind!r} (expected list_tools, call_tool or verify)",
                               field=f"{here}.action")
        name = entry.get("tool_name") or ("verify" if kind == "verify" else None)
        _expect(name, str, f"{here}.tool_name", "a string")
        args = _arguments(entry.get("arguments"), f"{here}.arguments")
        failed = kind != "verify" and (
            entry.get("success") is False or (entry.get("error") is not None and entry.get("result") is None))
        if kind == "verify":
            value = entry.get("verify_result", entry.get("result"))
        elif failed:
            value = entry.get("error")
        else:
            value = entry.get("result")
        if value is None:
            field = "verify_result" if kind == "verify" else ("error" if entry.get("success") is False else "result")
            raise EpisodeError("missing observation", field=f"{here}.{field}")
        turns.append(_Turn(name, args, serialize_output(value), _warnings(entry.get("warning"), f"{here}.warning"),
                           error=failed, verify=kind == "verify"))
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

    ``format="awm-agent"``: the official AWM agent's conversation (:mod:`echo_trl.awm_agent`).
    ``verify_turn`` (``env_output`` | ``omit``, default per format) keeps or drops the verifier
    step (dropped: a recorded final answer ends the chat). A record with ``messages`` (a
    conversation log) is read as recorded by :mod:`echo_trl.conversations`.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})")
    if verify_turn not in (None, *VERIFY_TURNS):
        raise ValueError(f"unknown verify_turn {verify_turn!r} (expected one of {', '.join(VERIFY_TURNS)})")
    from .conversations import conversation_to_trajectory, is_conversation

    if is_conversation(episode):
        return conversation_to_trajectory(episode, source=source, record_id=record)
    try:
        return _convert(episode, system_prompt, compact_tools, format, verify_turn or default_verify_turn(format))
    except EpisodeError as exc:
        raise exc.at(source=source, record=record) from None


def _final_answer(turns: list[_Turn], episode: dict[str, Any]) -> str | None:
    """The agent's answer: given to the verifier (``final_answer``) or recorded beside the steps."""
    answer = next((t.arguments["final_answer"] for t in turns
                   if t.verify and isinstance(t.arguments.get("final_answer"), str)), episode.get("final_answer"))
    return None if answer is None else _expect(answer, str, "final_answer", "a string")


def _convert(episode: Any, system_prompt: str | None, compact_tools: bool = False,
             format: str = "chat-template", verify_turn: str = "env_output") -> Trajectory:
    _expect(episode, dict, "", "an episode object")
    scenario = _expect(_required(episode, "scenario", ""), str, "scenario", "a string")
    task = _expect(_required(episode, "task", ""), str, "task", "a string")
    if not task.strip():
        raise EpisodeError("expected a non-empty task", field="task")
    task_idx = _expect(_required(episode, "task_idx", ""), int, "task_idx", "an integer")

    reward, listed = None, None
    if "trajectory" in episode:
        turns, listed, reward = _session_turns(episode["trajectory"])
        tools = _tools(episode.get("tools") if episode.get("tools") is not None else listed, compact=compact_tools)
    elif "steps" in episode:
        turns = _openenv_turns(episode["steps"])
        tools = _tools(episode.get("tools"), compact=compact_tools)
    else:
        raise EpisodeError("missing (expected steps or trajectory)", field="steps")
    if not turns:
        raise EpisodeError("episode has no tool calls", field="trajectory" if "trajectory" in episode else "steps")

    if episode.get("reward") is not None:
        reward = _finite(episode["reward"], "reward")
    if reward is None:
        reward_type = (episode.get("reward_type") or "")
        if reward_type not in AWM_REWARDS:
            raise EpisodeError("missing (and no reward_type to derive it from)", field="reward")
        reward = AWM_REWARDS[reward_type]
    final_answer = _final_answer(turns, episode)
    logprobs = _behavior_logprobs(episode.get("behavior_logprobs"))
    if format == "awm-agent":
        from . import awm_agent

        steps = [awm_agent.RecordedStep(t.name, t.arguments, t.output, t.warnings, t.error, t.verify) for t in turns]
        return awm_agent.to_awm_agent_trajectory(
            task=task, tools=awm_agent.listed_tools(episode.get("tools") if episode.get("tools") is not None else listed),
            steps=steps, reward=reward, scenario=scenario, task_idx=task_idx, final_answer=final_answer,
            verify_turn=verify_turn, behavior_logprobs=logprobs,
            system_prompt=awm_agent.SYSTEM_PROMPT if system_prompt == DEFAULT_SYSTEM_PROMPT
            else system_prompt and system_prompt.replace("{scenario}", scenario))
    if verify_turn == "omit":
        turns = [t for t in turns if not t.verify]

    prompt = []
    if system_prompt:
        prompt.append({"role": "system", "content": system_prompt.format(scenario=scenario)})
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
        prompt=prompt, completion=completion, tools=tools, warnings=warnings, reward=reward,
        scenario=scenario, task_idx=task_idx, behavior_logprobs=logprobs,
    )


def load_awm_episodes(
    inputs: Iterable[str | Path],
    *,
    strict: bool = True,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
    show_progress: bool | None = False,
    format: str = "chat-template",
    verify_turn: str | None = None,
) -> tuple[list[Trajectory], list[SkippedRecord]]:
    """Read and convert every episode under ``inputs``.

    ``strict=True`` raises the first :class:`EpisodeError`; ``strict=False`` keeps every valid
    episode and returns the rejected records with their reasons (nothing valid is lost).
    ``format`` and ``verify_turn``: see :func:`awm_episode_to_trajectory`.
    """
    from .progress import progress

    trajectories, skipped = [], []
    for rec in progress(iter_episode_records(inputs), desc="episodes", unit="ep", enable=show_progress):
        try:
            if rec.error is not None:
                raise rec.error
            trajectories.append(awm_episode_to_trajectory(
                rec.data, source=rec.source, record=rec.record or None, system_prompt=system_prompt,
                compact_tools=compact_tools, format=format, verify_turn=verify_turn))
        except EpisodeError as exc:
            if strict:
                raise
            skipped.append(SkippedRecord(rec.source, rec.record, str(exc),
                                         rec.data if rec.error is None else rec.raw))
    return trajectories, skipped
