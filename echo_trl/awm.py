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
import os
from collections.abc import Callable, Iterable, Iterator
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
# Reading files


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf: a number no float can hold, not infinity
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_json(text: str) -> Any:
    """Strict JSON: duplicated keys, NaN/Infinity and overflowing numbers are errors.

    Raises ``ValueError`` (also for integers longer than Python's digit limit) or
    ``RecursionError`` (nesting deeper than the interpreter's recursion limit).
    """
    return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant,
                      parse_float=_finite_float)


def is_episode_file(path: Path) -> bool:
    """An episode file by its suffix, in any case (``.JSON`` from some exporters), never our own report."""
    return path.suffix.lower() in EPISODE_SUFFIXES and path.name != "skipped.jsonl"


def _walk_input(path: Path) -> tuple[list[Path], list[EpisodeError]]:
    """Episode files under one input and the parts that could not be searched, each named.

    ``Path.rglob`` silently skips directories it cannot list; ``os.walk`` reports them.
    """
    if path.is_file():
        return [path], []
    if not path.is_dir():
        return [], [EpisodeError("no such file or directory", source=str(path))]
    files: list[Path] = []
    problems: list[EpisodeError] = []

    def unreadable(exc: OSError) -> None:
        problems.append(EpisodeError(f"cannot read directory: {exc.strerror or exc}",
                                     source=str(exc.filename or path)))

    for root, _dirs, names in os.walk(path, onerror=unreadable):
        for name in names:
            file = Path(root, name)
            if not is_episode_file(file):
                continue
            if file.is_file():
                files.append(file)
            else:  # a dangling link or a FIFO named *.json: say so rather than skip it
                problems.append(EpisodeError("not a regular file (a dangling link?)", source=str(file)))
    files.sort()
    if not files and not problems:
        problems.append(EpisodeError(f"no episode files ({', '.join(EPISODE_SUFFIXES)}) in this directory",
                                     source=str(path)))
    return files, problems


def find_episode_files(inputs: Iterable[str | Path], problems: list[EpisodeError] | None = None) -> list[Path]:
    """Expand files and directories into a sorted, de-duplicated list of episode files.

    Inputs that cannot be searched (missing, unreadable subdirectories, directories without
    episode files) raise :class:`EpisodeError`, or are appended to ``problems`` when given.
    """
    files: list[Path] = []
    for item in inputs:
        found, errors = _walk_input(Path(item))
        if errors and problems is None:
            raise errors[0]
        files.extend(found)
        if problems is not None:
            problems.extend(errors)
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

    A broken line in a JSONL file does not hide the valid lines around it; an input or
    subdirectory that cannot be searched is a record with an error, never silently nothing.
    """
    problems: list[EpisodeError] = []
    files = find_episode_files(inputs, problems)
    for problem in problems:
        yield EpisodeRecord(problem.source, "", error=problem)
    for path in files:
        source = str(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            yield EpisodeRecord(source, "", error=EpisodeError(f"cannot read file: {exc.strerror or exc}",
                                                               source=source))
            continue
        if path.suffix.lower() == ".jsonl":
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
        raise EpisodeError(f"lone surrogate {ascii(bad)} at character {exc.start} is not valid Unicode text",
                           field=field or None) from None


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
        parts = [_output_text(observation[k], f"{here}.observation.{k}") for k in ("tool_result", "error", "verify_result")
                 if observation.get(k) is not None]
        if not parts:
            raise EpisodeError("expected one of tool_result, error, verify_result", field=f"{here}.observation")
        turns.append(_Turn(name, args, "\n".join(parts), _warnings(observation.get("warning"), f"{here}.observation.warning")))
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
        if kind == "verify":
            key = "verify_result" if "verify_result" in entry else "result"
        elif entry.get("success") is False or (entry.get("error") is not None and entry.get("result") is None):
            key = "error"
        else:
            key = "result"
        value = entry.get(key)
        if value is None:
            raise EpisodeError("missing observation", field=f"{here}.{'verify_result' if kind == 'verify' else key}")
        turns.append(_Turn(name, args, _output_text(value, f"{here}.{key}"),
                           _warnings(entry.get("warning"), f"{here}.warning")))
    return turns, tools, reward


def awm_episode_to_trajectory(
    episode: Any,
    *,
    source: str = "<episode>",
    record: str | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
) -> Trajectory:
    """Map one recorded AWM episode (either shape) onto a role-tagged :class:`Trajectory`.

    System prompt and task become the prompt (``context``); each step becomes an assistant
    message with one tool call (``action``) followed by a ``tool`` message holding the tool
    result, error or verifier output (``env_output``). Harness warnings go to
    ``Trajectory.warnings``, never into the tool message text. ``compact_tools`` drops the
    response documentation from tool descriptions (:func:`compact_tool_schema`). Raises
    :class:`EpisodeError` naming ``source``, ``record`` and the offending field.
    """
    try:
        check_text(episode)
        return _convert(episode, system_prompt, compact_tools)
    except EpisodeError as exc:
        raise exc.at(source=source, record=record) from None
    except (RecursionError, OverflowError, TypeError, ValueError) as exc:
        # A backstop: content the checks above did not foresee is still this record's error.
        raise EpisodeError(f"cannot convert ({type(exc).__name__}: {exc})", source=source, record=record) from None


def _convert(episode: Any, system_prompt: str | None, compact_tools: bool = False) -> Trajectory:
    _expect(episode, dict, "", "an episode object")
    scenario = _expect(_required(episode, "scenario", ""), str, "scenario", "a string")
    task = _expect(_required(episode, "task", ""), str, "task", "a string")
    if not task.strip():
        raise EpisodeError("expected a non-empty task", field="task")
    task_idx = _int64(_required(episode, "task_idx", ""), "task_idx")

    reward = None
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
    return Trajectory(
        prompt=prompt, completion=completion, tools=tools, warnings=warnings, reward=reward,
        scenario=scenario, task_idx=task_idx, behavior_logprobs=_behavior_logprobs(episode.get("behavior_logprobs")),
    )


def load_awm_episodes(
    inputs: Iterable[str | Path],
    *,
    strict: bool = True,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
    show_progress: bool | None = False,
    check: Callable[[Trajectory], None] | None = None,
) -> tuple[list[Trajectory], list[SkippedRecord]]:
    """Read and convert every episode under ``inputs``.

    ``strict=True`` raises the first :class:`EpisodeError`; ``strict=False`` keeps every valid
    episode and returns the rejected records with their reasons (nothing valid is lost).
    ``check`` runs on each converted trajectory inside its record's error handling (the dataset
    builder passes its Arrow encoder), so an :class:`EpisodeError` it raises names this record.
    Input that yields no episode at all is an error in both modes.
    """
    from .progress import progress

    inputs = list(inputs)
    trajectories, skipped = [], []
    for rec in progress(iter_episode_records(inputs), desc="episodes", unit="ep", enable=show_progress):
        try:
            if rec.error is not None:
                raise rec.error
            trajectory = awm_episode_to_trajectory(
                rec.data, source=rec.source, record=rec.record or None, system_prompt=system_prompt,
                compact_tools=compact_tools)
            if check is not None:
                check(trajectory)
            trajectories.append(trajectory)
        except EpisodeError as exc:
            exc = exc.at(source=rec.source, record=rec.record or None)
            if strict:
                raise exc from None
            skipped.append(SkippedRecord(rec.source, rec.record, str(exc),
                                         rec.data if rec.error is None else rec.raw))
    if not trajectories:
        where = ", ".join(map(str, inputs)) or "<no inputs>"
        detail = f"all {len(skipped)} record(s) are invalid; first: {skipped[0].reason}" if skipped else \
            "no episode records"
        raise EpisodeError(f"no valid episodes ({detail})", source=where)
    return trajectories, skipped
