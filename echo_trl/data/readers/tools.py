"""Tools and their calls as every conversation format writes them: schemas, arguments, outputs.

One function each, used by the recorded-episode readers, the dataset builder and the live
environment alike, so that a tool renders the same way at capture time and at training time.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import EpisodeError
from .episode_files import parse_json
from .fields import check_text, expect, required


def no_parameters() -> dict[str, Any]:
    """The parameters of a tool that declares none (a fresh object each call)."""
    return {"type": "object", "properties": {}}


def tool_schema(tool: Any, field: str = "tools[0]") -> dict[str, Any]:
    """A tool as the JSON schema chat templates take, from a name, an MCP tool or an OpenAI tool.

    An MCP tool without a description (the protocol makes it optional) gets ``""``, one without
    an input schema no parameters; ``input_schema`` and ``parameters`` are accepted for ``inputSchema``.
    """
    if isinstance(tool, str):
        if not tool:
            raise EpisodeError("expected a non-empty tool name", field=field)
        return {"type": "function", "function": {"name": tool, "description": "", "parameters": no_parameters()}}
    expect(tool, dict, field, "a tool name or a tool object")
    if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
        name = tool["function"].get("name")
        expect(name, str, f"{field}.function.name", "a string")
        return tool
    name = expect(required(tool, "name", field), str, f"{field}.name", "a string")
    description = tool.get("description") or ""
    expect(description, str, f"{field}.description", "a string")
    params = tool.get("inputSchema", tool.get("input_schema", tool.get("parameters")))
    if params is None:
        params = no_parameters()
    expect(params, dict, f"{field}.inputSchema", "a JSON schema object")
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


def tool_schemas(value: Any, field: str = "tools", compact: bool = False) -> list[dict[str, Any]]:
    """Every tool of a list (names, MCP or OpenAI tools; ``None`` is none) as chat-template schemas.

    What the live model policy passes to its chat template and what the dataset builder stores:
    the same function, so capture and training render the same tools.
    """
    if value is None:
        return []
    expect(value, list, field, "a list of tool names or tool objects")
    schemas = [tool_schema(t, f"{field}[{i}]") for i, t in enumerate(value)]
    return [compact_tool_schema(s) for s in schemas] if compact else schemas


def tool_arguments(value: Any, field: str) -> dict[str, Any]:
    """A tool call's arguments as an object: given as one, as JSON text (OpenAI), or absent (``{}``)."""
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
    return expect(value, dict, field, "an object of tool arguments")


def serialize_output(value: Any) -> str:
    """Environment output as text: strings verbatim, anything else as deterministic JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2)


def output_text(value: Any, field: str) -> str:
    """:func:`serialize_output` of a record's value; one it cannot write is this field's error."""
    try:
        return serialize_output(value)
    except RecursionError:
        raise EpisodeError("nested too deeply to serialise", field=field) from None
    except (TypeError, ValueError) as exc:  # Python objects given through the API, not JSON
        raise EpisodeError(f"not JSON-serialisable ({exc})", field=field) from None
