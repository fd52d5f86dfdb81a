"""Conversation logs with a reward (e.g. OpenEnv's ``openenv collect`` output) as trajectories.

``openenv collect`` writes ``results.jsonl``, one episode per line
(``openenv/core/harness/collect.py``, ``EpisodeRecord``)::

    {episode_id, messages: [{role, content, tool_calls?, tool_call_id?, name?}, ...], reward, done,
     tool_trace, metrics, verify_metrics, artifacts, task, extra}

The conversation is taken as recorded: roles come from the message roles (the leading system
and user messages are the prompt, ``context``; ``assistant`` turns are ``action``; ``tool``
messages are ``env_output``, their content verbatim), so a log in any format, the official AWM
agent's included, trains as it was played. Tool-call arguments may be JSON text (OpenAI) or
objects. Scenario and task index come from ``task`` or ``extra`` (or the record itself) when
they are there; otherwise trajectories of the same prompt form one GRPO group.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ...errors import EpisodeError
from ...roles import CHAT_ROLES, Message, Trajectory, tool_call
from .fields import behavior_logprobs, expect, finite
from .tools import serialize_output, tool_arguments, tool_schema

__all__ = ["conversation_to_trajectory"]


def _fail(message: str, field: str) -> EpisodeError:
    return EpisodeError(message, field=field)


def _content(value: Any, field: str) -> str:
    """Text content: a string, null, or OpenAI content parts of type text (joined)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _fail("expected a text content part {type: text, text: string}", f"{field}[{i}]")
            texts.append(part["text"])
        return "".join(texts)
    raise _fail(f"expected a string or a list of text parts, got {type(value).__name__}", field)


def _tool_calls(value: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _fail("expected a list of tool calls", field)
    calls = []
    for i, call in enumerate(value):
        here = f"{field}[{i}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise _fail("expected {function: {name, arguments}}", here)
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _fail("expected a non-empty tool name", f"{here}.function.name")
        calls.append(tool_call(fn["name"], tool_arguments(fn.get("arguments"), f"{here}.function.arguments")))
        if isinstance(call.get("id"), str) and call["id"]:  # kept: templates that render call ids use it
            calls[-1]["id"] = call["id"]
    return calls


def _message(value: Any, field: str) -> Message:
    if not isinstance(value, dict):
        raise _fail("expected a message object", field)
    role = value.get("role")
    if role not in CHAT_ROLES:
        raise _fail(f"unknown role {role!r} (expected one of {', '.join(CHAT_ROLES)})", f"{field}.role")
    content = value.get("content")
    if role == "tool" and isinstance(content, (dict, int, float, bool)):
        content = serialize_output(content)  # structured tool data, as the AWM reader writes it
    message: Message = {"role": role, "content": _content(content, f"{field}.content")}
    if role == "tool" and isinstance(value.get("name"), str):
        message["name"] = value["name"]
    if role == "tool" and isinstance(value.get("tool_call_id"), str):
        message["tool_call_id"] = value["tool_call_id"]
    if role == "assistant" and value.get("tool_calls"):
        message["tool_calls"] = _tool_calls(value["tool_calls"], f"{field}.tool_calls")
        if content is None:  # a tool-call turn recorded without content stays so
            message["content"] = None
    return message


def _provenance(record: dict[str, Any]) -> tuple[str, int | None]:
    """(scenario, task_idx) from ``task``, ``extra`` or the record itself, where given."""
    for where in (record.get("task"), record.get("extra"), record):
        if isinstance(where, dict) and isinstance(where.get("scenario"), str):
            idx = where.get("task_idx")
            return where["scenario"], idx if isinstance(idx, int) and not isinstance(idx, bool) else None
    return "", None


def _convert(record: Any) -> Trajectory:
    if not isinstance(record, dict):
        raise _fail("expected a conversation object", "")
    if "reward" not in record:
        raise _fail("missing", "reward")
    reward = finite(record["reward"], "reward")
    raw = expect(record["messages"], list, "messages", "a list of messages")
    messages = [_message(m, f"messages[{i}]") for i, m in enumerate(raw)]
    first = next((i for i, m in enumerate(messages) if m["role"] in ("assistant", "tool")), None)
    if first is None:
        raise _fail("no assistant turn", "messages")
    if not any(m["role"] == "user" for m in messages[:first]):
        raise _fail("no user message before the first assistant turn", "messages")
    tools = expect(record.get("tools") or [], list, "tools", "a list of tools")
    logprobs = behavior_logprobs(record.get("behavior_logprobs"))
    scenario, task_idx = _provenance(record)
    prompt = messages[:first]
    # Without a scenario, trajectories of the same prompt form one group; with one, the task's default group.
    group = "" if scenario else "prompt:" + hashlib.sha1(json.dumps(prompt, sort_keys=True).encode()).hexdigest()[:12]
    return Trajectory(
        prompt=prompt,
        completion=messages[first:],
        tools=[tool_schema(t, f"tools[{i}]") for i, t in enumerate(tools)],
        reward=reward,
        scenario=scenario,
        task_idx=task_idx if task_idx is not None else -1,
        group_id=group,
        behavior_logprobs=logprobs,
    )


def conversation_to_trajectory(
    record: Any, *, source: str = "<conversation>", record_id: str | None = None
) -> Trajectory:
    """One conversation log (``messages`` + ``reward``) as a :class:`Trajectory`, as recorded.

    Raises :class:`EpisodeError` naming ``source``, ``record_id`` and the field, e.g.
    ``results.jsonl:4: messages[2].tool_calls[0].function.arguments: arguments string is not valid JSON``.
    """
    try:
        return _convert(record)
    except EpisodeError as exc:
        raise exc.at(source=source, record=record_id) from None
