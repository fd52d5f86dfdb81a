"""The official AWM agent's conversation format (``awm/core/agent.py`` in ``agent-world-model``).

The Arctic-AWM models were trained on this conversation, not on a chat template's tool calls:

* a fixed system prompt (:data:`SYSTEM_PROMPT`; not parameterized: no scenario, no tool list) that
  describes two meta-tools in its text, ``list_tools`` and ``call_tool``;
* the agent first calls ``list_tools``; the reply is a text listing of the scenario's MCP tools,
  each named ``mcp_tool_<name>`` (:func:`list_tools_reply`);
* every scenario call is ``call_tool`` with ``{"tool_name": "mcp_tool_<name>", "arguments":
  "<JSON string>"}``; the reply is the tool's text, or ``Error: <text>`` when the call failed;
* the agent's last turn is its answer (a turn without a tool call ends the episode);
* the chat template gets no tool schemas (the official agent passes none to the model server).

Everything here is a pure function reproducing that format exactly (tests compare against the
official package's own output in ``tests/fixtures/awm_official/``); the official package is never
imported. Call parsing repairs JSON with ``json_repair``, the library the official agent uses.

Stable API (also for the live environment and ``capture``): :data:`SYSTEM_PROMPT`,
:func:`meta_tool_schemas`, :func:`list_tools_reply` (the text of the two meta-tools' turns);
:func:`parse_tool_calls`, :func:`parse_call_tool_arguments`, :func:`robust_json_loads`,
:func:`next_action` / :func:`action_for_call` (what to do with an assistant turn, as the
official loop does); :func:`error_text`, :func:`unknown_tool_text`, :func:`timeout_text`,
:func:`tool_reply_text` (reply texts); :func:`list_tools_message`, :func:`call_tool_message`,
:func:`tool_call_text` (messages); :func:`to_awm_agent_trajectory` with :class:`RecordedStep`
and :func:`listed_tools` (recorded episode -> conversation).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ...errors import EpisodeError
from ...io import strict_json
from ...roles import Message, Trajectory, tool_call
from .prompt import prompt_messages
from .tools import tool_schema

__all__ = [
    "list_tools_reply",
    "meta_tool_schemas",
    "parse_tool_calls",
    "parse_call_tool_arguments",
    "next_action",
    "action_for_call",
    "robust_json_loads",
    "to_awm_agent_trajectory",
]

LIST_TOOLS = "list_tools"
CALL_TOOL = "call_tool"
#: Prefix the ``list_tools`` reply puts before every MCP tool name (stripped again when called).
TOOL_PREFIX = "mcp_tool_"
#: Prefix of every failed call's reply.
ERROR_PREFIX = "Error: "

_IN = " " * 8  # the prompt keeps the source indentation of most of its lines (a dedent that did not apply)

#: Descriptions of the meta-tools, word for word as the system prompt gives them.
LIST_TOOLS_DESCRIPTION = "List all available MCP tools for the current environment to help you finish the user task."
CALL_TOOL_DESCRIPTION = "Call a MCP environment-specific tool"
TOOL_NAME_DESCRIPTION = "the tool name in the list_tools output"
ARGUMENTS_DESCRIPTION = (
    "the arguments for calling <tool_name>. You must pass a valid JSON string without any markdown fences or "
    "additional commentary. This JSON str will be parsed by the tool and executed. You can pass an empty JSON "
    "str if no arguments are required by <tool_name>."
)

_TOOLS_BLOCK = [
    "1. list_tools",
    f"    - Description: {LIST_TOOLS_DESCRIPTION}",
    "    - Arguments: None",
    "    - Output: A list of MCP environment-specific tools and their descriptions",
    "",
    "2. call_tool",
    f"    - Description: {CALL_TOOL_DESCRIPTION}",
    "    - Arguments:",
    f"        - tool_name: str, required, {TOOL_NAME_DESCRIPTION}",
    f"        - arguments: str, required, {ARGUMENTS_DESCRIPTION}",
    "    - Output: The result of the <tool_name> tool call",
]
_OUTER = [
    "# MCP Toolss",  # sic: the official prompt's own spelling
    "",
    "You are at a MCP environment. You need to call MCP tools to assist with the user query. At each step, "
    "you can only call one function. You have already logged in, and your user id is 1 if required for the "
    "MCP tool.",
    "",
    "You are provided with TWO functions within <tools></tools> XML tags:",
    "<tools>",
    "\n".join(_TOOLS_BLOCK),
    "</tools>",
    "",
    "You should always call list_tools function first to get the available tools, and should only call it "
    "once. You should always directly output the answer or summary at the final step instead of calling any "
    "function. ",
    "",
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:",
    "<tool_call>",
    '{"name": <function-name>, "arguments": <args-json-object>}',
    "</tool_call>",
    "",
    "Example Function Call #1:",
    "<tool_call>",
    '{"name": "list_tools", "arguments": null}',
    "</tool_call>",
    "",
    "Example Function Call #2:",
    "<tool_call>",
    '{"name": "call_tool", "arguments": {"tool_name": "get_weather", "arguments": "{"city": "Beijing"}"}}',
    "</tool_call>",
]

#: The official agent's system prompt, byte for byte (its odd indentation and typo included).
SYSTEM_PROMPT = "\n".join(_IN + line if line else "" for line in _OUTER)


def meta_tool_schemas() -> list[dict[str, Any]]:
    """The two meta-tools as JSON tool schemas (the only tools an awm-agent conversation has).

    The official agent declares them in the system prompt's text only; these schemas carry the
    same names, argument names, types and descriptions for code that needs a schema (TRL's
    ``tools``, the dataset's ``tools`` column). A fresh copy on every call.
    """
    return [
        {
            "type": "function",
            "function": {
                "name": LIST_TOOLS,
                "description": LIST_TOOLS_DESCRIPTION,
                "parameters": {"type": "object", "properties": {}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": CALL_TOOL,
                "description": CALL_TOOL_DESCRIPTION,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "tool_name": {"type": "string", "description": TOOL_NAME_DESCRIPTION},
                        "arguments": {"type": "string", "description": ARGUMENTS_DESCRIPTION},
                    },
                    "required": ["tool_name", "arguments"],
                },
            },
        },
    ]


# The list_tools reply


def _schema_lines(schema: Mapping[str, Any], indent: int, required: Sequence[str] | None = None) -> list[str]:
    """One entry per property (type, required/optional, description, default, enum), nested objects indented."""
    pad = " " * indent
    required = schema.get("required", []) if required is None else required
    lines = []
    for prop, info in (schema.get("properties") or {}).items():
        info = info if isinstance(info, Mapping) else {}
        kind = info.get("type", "unknown")
        lines.append(f"{pad}- {prop}: {kind} ({'required' if prop in required else 'optional'})")
        if info.get("description", ""):
            lines.append(f"{pad}  Description: {info['description']}")
        if info.get("default") is not None:
            lines.append(f"{pad}  Default: {info['default']}")
        if info.get("enum"):
            lines.append(f"{pad}  Allowed values: {info['enum']}")
        nested = info.get("properties", {})
        if kind == "object" and nested:
            nested_required = info.get("required", [])
            lines.append(f"{pad}  Properties:")
            lines.extend(
                _schema_lines({"properties": nested, "required": nested_required}, indent + 4, nested_required)
            )
    return lines


def list_tools_reply(tools: Sequence[Mapping[str, Any]]) -> str:
    """The reply to ``list_tools``: the MCP tools (``name``, ``description``, ``inputSchema``) as text.

    Byte-identical to the official agent's rendering of the same tool objects: names prefixed
    ``mcp_tool_``, the first description line after ``Description:``, the rest indented (blank
    lines dropped), parameters with type, required/optional, description, default and allowed
    values (Python's ``str`` of the value, as the official code prints it), nested object
    properties indented by four more. A tool named ``list_tools`` is left out. ``input_schema``
    is accepted for ``inputSchema``.
    """
    shown = [t for t in tools if t.get("name") != LIST_TOOLS]
    lines = [f"Available MCP Tools ({len(shown)} tools):", "=" * 80, ""]
    for i, tool in enumerate(shown, 1):
        name = tool.get("name", "")
        description = tool.get("description") or ""
        schema = tool.get("inputSchema", tool.get("input_schema", {}))
        first, *rest = description.split("\n")
        lines.append(f"{i}. {name if name.startswith(TOOL_PREFIX) else TOOL_PREFIX + name}")
        lines.append(f"   Description: {first.strip()}")
        more = "\n".join(line.strip() for line in rest).strip()
        lines.extend(f"   {line}" for line in more.split("\n") if line.strip())
        if schema and schema.get("properties"):
            lines.append("   Parameters:")
            lines.extend(_schema_lines(schema, 6))
        else:
            lines.append("   Parameters: None")
        lines.append("")
    return "\n".join(lines).strip()


# Parsing the agent's turns


def robust_json_loads(text: Any) -> Any:
    """JSON as the official agent reads model output: strict first, then repaired by ``json_repair``.

    Blank text is ``{}``; lone surrogates are dropped (escaped ones replaced by U+FFFD); what ``json_repair``
    cannot read at all (it returns ``""`` or recurses too deep) is ``{}``, and so is a value holding NaN or
    Infinity, which no JSON file can record (strict JSON is read first: :mod:`echo_trl.io.strict_json`). Unlike
    the official helper, a string naming an existing ``.json`` file is not read (model output never opens files).
    """
    if isinstance(text, list):
        return [robust_json_loads(item) for item in text]
    if not isinstance(text, str):
        return text
    text = text.encode("utf-8", errors="ignore").decode("utf-8").strip()
    if not text:
        return {}
    try:
        return strict_json.scrub(strict_json.loads(text))[0]
    except strict_json.StrictJSONError:
        pass
    import json_repair

    try:  # hundreds of unclosed brackets, "" (unreadable), NaN / Infinity or nesting too deep to record: {}
        value = json_repair.loads(text)
        return {} if value == "" or strict_json.non_finite_path(value) is not None else strict_json.scrub(value)[0]
    except (RecursionError, ValueError, strict_json.StrictJSONError):
        return {}


@dataclass(frozen=True)
class AgentCall:
    """One ``<tool_call>`` block as the official agent parses it (``mcp_tool_*`` names folded into call_tool)."""

    name: str
    arguments: Any = None


_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(content: str) -> list[AgentCall]:
    """Every ``<tool_call>...</tool_call>`` block of an assistant turn, in order.

    Each block is read with :func:`robust_json_loads`; a list is replaced by its first object;
    unreadable blocks are skipped (so a turn whose only call is unreadable counts as the final
    answer, as in the official loop). A call named ``mcp_tool_X`` becomes ``call_tool`` with
    ``{"tool_name": "mcp_tool_X", "arguments": <its arguments or {}>}``. Where the official
    code would crash on a non-string ``name``, the name is taken as ``""`` (an unknown tool).
    As there, a literal ``</tool_call>`` inside an argument ends the block early.
    """
    calls = []
    for block in _CALL_BLOCK.findall(content or ""):
        data = robust_json_loads(block.strip())
        if not data:
            continue
        if isinstance(data, list):
            if not isinstance(data[0], dict):
                continue
            data = data[0]
        if not isinstance(data, dict):
            continue
        name = data.get("name", "")
        name = name if isinstance(name, str) else ""
        arguments = data.get("arguments", {})
        if name.startswith(TOOL_PREFIX):
            name, arguments = CALL_TOOL, {"tool_name": name, "arguments": arguments if arguments else {}}
        calls.append(AgentCall(name, arguments))
    return calls


def parse_call_tool_arguments(arguments: Any) -> tuple[str, dict[str, Any]]:
    """``call_tool``'s arguments -> (MCP tool name without ``mcp_tool_``, argument object).

    Arguments may be an object or a JSON string (repaired); the inner ``arguments`` likewise
    (blank -> ``{}``). Anything that is not an object becomes ``("", {})`` or ``{}``, as in the
    official agent (a call to the tool ``""`` then fails at the server). A non-string
    ``tool_name`` counts as ``""`` (the official code would crash).
    """
    if isinstance(arguments, str):
        arguments = robust_json_loads(arguments)
    if not isinstance(arguments, dict):
        return "", {}
    name = arguments.get("tool_name", "")
    name = name if isinstance(name, str) else ""
    inner = arguments.get("arguments", {})
    if name.startswith(TOOL_PREFIX):
        name = name[len(TOOL_PREFIX) :]
    if isinstance(inner, str):
        inner = robust_json_loads(inner) if inner.strip() else {}
    return name, inner if isinstance(inner, dict) else {}


@dataclass(frozen=True)
class AgentAction:
    """What the environment does with one assistant turn (the official loop's dispatch).

    ``kind``: ``final`` (no readable call: the turn is the answer), ``list_tools``,
    ``call_tool`` (``tool_name`` without prefix, ``arguments`` an object) or ``unknown`` (a
    call to another name; the reply is :func:`unknown_tool_text`). ``ignored`` counts the
    further calls of the turn, which the official agent skips (one call per turn).
    """

    kind: Literal["final", "list_tools", "call_tool", "unknown"]
    name: str = ""
    tool_name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    ignored: int = 0


def action_for_call(name: str, arguments: Any = None, *, ignored: int = 0) -> AgentAction:
    """Dispatch one already-parsed call (e.g. one a chat template's parser returned)."""
    if name == LIST_TOOLS:
        return AgentAction("list_tools", name, ignored=ignored)
    if name == CALL_TOOL:
        tool_name, args = parse_call_tool_arguments(arguments)
        return AgentAction("call_tool", name, tool_name, args, ignored=ignored)
    if name.startswith(TOOL_PREFIX):
        tool_name, args = parse_call_tool_arguments({"tool_name": name, "arguments": arguments or {}})
        return AgentAction("call_tool", CALL_TOOL, tool_name, args, ignored=ignored)
    return AgentAction("unknown", name, ignored=ignored)


def next_action(content: str) -> AgentAction:
    """Dispatch an assistant turn's text: its first call, or the final answer when there is none."""
    calls = parse_tool_calls(content)
    if not calls:
        return AgentAction("final")
    return action_for_call(calls[0].name, calls[0].arguments, ignored=len(calls) - 1)


# Reply texts


def error_text(message: str) -> str:
    """A failed call's reply: the tool's error text (or the exception's) after ``Error: ``."""
    return f"{ERROR_PREFIX}{message}"


def unknown_tool_text(name: str) -> str:
    """Reply to a call of anything but the two meta-tools."""
    return error_text(f"Unknown tool '{name}'. Only 'list_tools' and 'call_tool' are available.")


def timeout_text(seconds: float) -> str:
    """Reply when a tool call timed out (``seconds`` printed as Python prints the float, e.g. 60.0)."""
    return error_text(f"Tool call timed out after {float(seconds)}s")


def tool_reply_text(texts: Sequence[str], is_error: bool) -> str:
    """Reply to a completed MCP call: its text contents joined by newlines, ``Error: `` if it failed."""
    text = "\n".join(texts)
    return error_text(text) if is_error else text


# Messages


def list_tools_message() -> Message:
    """The agent's ``list_tools`` turn (its first)."""
    return {"role": "assistant", "content": "", "tool_calls": [tool_call(LIST_TOOLS, {})]}


def call_tool_message(tool_name: str, arguments: Mapping[str, Any]) -> Message:
    """The agent's ``call_tool`` turn: prefixed tool name, arguments as a JSON string."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            tool_call(
                CALL_TOOL,
                {
                    "tool_name": tool_name if tool_name.startswith(TOOL_PREFIX) else TOOL_PREFIX + tool_name,
                    "arguments": json.dumps(dict(arguments), ensure_ascii=False),
                },
            )
        ],
    }


def tool_call_text(name: str, arguments: Any) -> str:
    """A call as text in the ``<tool_call>`` block the system prompt asks for (what a model writes)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


@dataclass(frozen=True)
class RecordedStep:
    """One recorded step, whatever file it came from: a scenario call or the verifier."""

    tool_name: str
    arguments: Mapping[str, Any]
    output: str
    warnings: Sequence[str] = ()
    error: bool = False
    verify: bool = False


VerifyTurn = Literal["env_output", "omit"]


def listed_tools(value: Any, field: str = "tools") -> list[dict[str, Any]]:
    """A recorded episode's tools as the MCP tool objects the ``list_tools`` reply lists.

    OpenAI-style schemas are turned back into ``{name, description, inputSchema}``; a tool
    given by name only is an :class:`EpisodeError`: without its description and input schema
    the reply cannot be the one the agent saw.
    """
    if not isinstance(value, list) or not value:
        raise EpisodeError("missing (the awm-agent format lists the MCP tool objects)", field=field)
    tools = []
    for i, tool in enumerate(value):
        fn = tool_schema(tool, f"{field}[{i}]")["function"]
        if isinstance(tool, str):
            raise EpisodeError(
                "a tool name only; the awm-agent format needs the MCP tool object (name, description, inputSchema)",
                field=f"{field}[{i}]",
            )
        tools.append(
            tool
            if "name" in tool
            else {
                "name": fn["name"],
                "description": fn.get("description") or "",
                "inputSchema": fn.get("parameters") or {},
            }
        )
    return tools


def to_awm_agent_trajectory(
    *,
    task: str,
    tools: Sequence[Mapping[str, Any]],
    steps: Sequence[RecordedStep],
    reward: float,
    scenario: str = "",
    task_idx: int = -1,
    final_answer: str | None = None,
    verify_turn: VerifyTurn = "omit",
    system_prompt: str | None = SYSTEM_PROMPT,
    behavior_logprobs: list[float] | None = None,
) -> Trajectory:
    """A recorded episode as the official agent's conversation.

    prompt: system prompt, task. completion: the ``list_tools`` call and its reply (the tool
    listing), then per step a ``call_tool`` turn and its reply (``Error: ...`` when the step
    failed), then the final answer when one was recorded. Every reply is a ``tool`` message
    (``env_output``); every assistant turn is ``action``. The verifier step is left out with
    ``verify_turn="omit"`` (the official agent never shows it to the policy, and its
    ``raw_result`` can reveal the answer); with ``"env_output"`` its output is a ``tool`` message
    right after the final answer. ``tools`` of the trajectory: the two meta-tools only.
    ``{scenario}`` in ``system_prompt`` is filled in (:func:`echo_trl.data.readers.prompt.prompt_messages`).
    """
    prompt = prompt_messages(system_prompt, scenario, task)
    completion: list[Message] = [
        list_tools_message(),
        {"role": "tool", "name": LIST_TOOLS, "content": list_tools_reply(tools)},
    ]
    warnings: list[list[str]] = [[], []]
    answer = [] if final_answer is None else [{"role": "assistant", "content": final_answer}]
    for step in steps:
        if step.verify:  # the answer goes where the agent gave it: to the verifier
            completion += answer
            warnings += [[] for _ in answer]
            answer = []
            if verify_turn == "env_output":
                completion.append({"role": "tool", "name": "verify", "content": step.output})
                warnings.append(list(step.warnings))
            continue
        completion.append(call_tool_message(step.tool_name, step.arguments))
        completion.append(
            {"role": "tool", "name": CALL_TOOL, "content": error_text(step.output) if step.error else step.output}
        )
        warnings += [[], list(step.warnings)]
    completion += answer
    warnings += [[] for _ in answer]
    return Trajectory(
        prompt=prompt,
        completion=completion,
        tools=meta_tool_schemas(),
        warnings=warnings,
        reward=reward,
        scenario=scenario,
        task_idx=task_idx,
        behavior_logprobs=behavior_logprobs,
    )
