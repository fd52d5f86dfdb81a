"""Independent expectations of a chat template's render: the template's own text and each family's
documented tool-call text."""

from __future__ import annotations

import json

from echo_trl.roles import Trajectory, tool_call
from echo_trl.tokens.tokenization import WARNING_SEPARATOR


def make_trajectory(outputs, *, warnings=None, args=None, tools=("lookup", "update")) -> Trajectory:
    completion, warns = [], []
    for i, out in enumerate(outputs):
        completion.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [tool_call(tools[i % len(tools)], (args or {}).get(i, {"id": i}))],
            }
        )
        completion.append({"role": "tool", "name": tools[i % len(tools)], "content": out})
        warns += [[], (warnings or {}).get(i, [])]
    return Trajectory(
        prompt=[{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Do the task."}],
        completion=completion,
        warnings=warns,
        reward=1.0,
        scenario="s",
        task_idx=0,
        tools=[
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": f"{n} things",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
            for n in tools
        ],
    )


def expected_tool_call_text(family: str, name: str, args: dict) -> str:
    """How each family's template renders one tool call (from the templates' documentation)."""
    if family == "llama3_1":
        return '{"name": "' + name + '", "parameters": ' + json.dumps(args) + "}<|eot_id|>"
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(args) + "}\n</tool_call><|im_end|>"


def rendered_content(family: str, text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1] if family == "llama3_1" else text


def expected_text(tok, t: Trajectory) -> str:
    """The template's own render of the conversation, warnings appended to their tool message."""
    messages = [
        *t.prompt,
        *[
            {**m, "content": m["content"] + "".join(WARNING_SEPARATOR + w for w in warns)}
            for m, warns in zip(t.completion, t.warnings, strict=True)
        ],
    ]
    return tok.apply_chat_template(messages, tools=t.tools, tokenize=False)
