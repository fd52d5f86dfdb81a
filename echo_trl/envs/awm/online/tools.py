"""MCP tools as Python methods TRL can offer a model: a real signature and a Google docstring per tool.

TRL (``GRPOTrainer``, 1.16) describes each tool method to the model with
``transformers.utils.get_json_schema`` (type hints + Google docstring); it reads neither signature
defaults nor schema keywords, so each argument's description carries the MCP schema's
``(default: ...)`` and ``(choices: [...])``, the one form ``get_json_schema`` turns back into an
``enum``. :func:`make_tool_method` builds such a method from an MCP tool's ``inputSchema``; a call
forwards to the environment's ``_call`` with the MCP argument names.
"""

from __future__ import annotations

import inspect
import json
import keyword
import re
from collections.abc import Callable
from typing import Any

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


def _hint(schema: dict[str, Any]) -> Any:
    """A Python type hint for a JSON schema (what ``get_json_schema`` turns back into JSON schema)."""
    if not isinstance(schema, dict):
        return str
    t = schema.get("type")
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(t, list):
        options = [{"type": x} for x in t]
    if options:
        hints = [_hint(o) for o in options if isinstance(o, dict) and o.get("type") != "null"]
        nullable = any(isinstance(o, dict) and o.get("type") == "null" for o in options)
        base = hints[0] if len(set(hints)) == 1 else str
        return base | None if nullable else base
    if t == "array":
        item = _hint(schema.get("items", {})) if isinstance(schema.get("items"), dict) else None
        return list[item] if item in (str, int, float, bool) else list
    return _JSON_TYPES.get(t, str)


def tool_identifier(name: str, taken: set[str]) -> str:
    ident = re.sub(r"\W", "_", name)
    if (
        not ident
        or ident[0].isdigit()
        or keyword.iskeyword(ident)
        or ident.startswith("_")
        or ident in ("reset", "get_reward", "self", "verify")
    ):
        ident = f"tool_{ident.lstrip('_')}"
    while ident in taken:
        ident += "_"
    taken.add(ident)
    return ident


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no description)"


def argument_doc(prop: dict[str, Any], fallback: str) -> str:
    """One argument's docstring text: its description plus the schema facts ``get_json_schema`` can carry.

    ``(default: ...)`` keeps the MCP schema's default in the description the model reads;
    ``(choices: [...])`` last, because ``get_json_schema`` turns exactly that suffix into ``enum``.
    """
    text = _one_line(prop.get("description") or prop.get("title") or fallback)
    if "default" in prop:
        text += f" (default: {json.dumps(prop['default'], ensure_ascii=False)})"
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, (str, int, float, bool)) for v in enum):
        text += f" (choices: {json.dumps(enum, ensure_ascii=False)})"
    return text


def make_tool_method(tool: dict[str, Any], method_name: str) -> Callable[..., str]:
    """A method with a real signature and Google docstring that forwards to MCP tool ``tool``."""
    schema = tool.get("inputSchema") or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    taken: set[str] = set()
    params, docs, names = [], [], {}
    for prop in sorted(props, key=lambda p: p not in required):  # required first (signature order)
        pname = tool_identifier(prop, taken)
        names[pname] = prop
        hint = _hint(props[prop])
        default = inspect.Parameter.empty if prop in required else None
        if default is None and not (hint is type(None) or "None" in repr(hint)):
            hint = hint | None
        params.append(
            inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=hint)
        )
        docs.append(f"    {pname}: {argument_doc(props[prop] if isinstance(props[prop], dict) else {}, prop)}")
    description = (tool.get("description") or tool["name"]).split("\n\n### Responses")[0].strip()
    doc = description + ("\n\nArgs:\n" + "\n".join(docs) if docs else "") + "\n\nReturns:\n    The tool's output."
    mcp_name = tool["name"]

    def method(self, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        arguments = {
            names.get(k, k): v
            for k, v in bound.arguments.items()
            if k != "self" and not (v is None and names.get(k, k) not in required)
        }
        return self._call(mcp_name, arguments)

    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    signature = inspect.Signature([self_param, *params], return_annotation=str)
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = {p.name: p.annotation for p in params} | {"return": str}
    method.__name__ = method.__qualname__ = method_name
    method.__doc__ = doc
    return method
