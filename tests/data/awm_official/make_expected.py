"""Regenerate the official-AWM-agent expectations in this directory (development time only).

Two steps, two interpreters (the official ``agent-world-model`` package needs Python >= 3.12 and
is never a dependency of echo_trl; this script only CALLS it):

1. ``python tests/data/awm_official/make_expected.py tools --out /tmp/awm_tools``
   (the project's environment) starts each scenario with echo_trl's own sandboxed runner and
   writes the MCP tool objects its server lists (``<scenario>.tools.json``).
2. ``/work/venv-awm/bin/python tests/data/awm_official/make_expected.py official \\
       --tools /tmp/awm_tools --out tests/data/awm_official``
   (a venv with ``agent-world-model==0.1.0`` and ``mcp<2``) writes what the official agent
   (``awm.core.agent``) produces: ``system_prompt.txt``, ``list_tools.<scenario>.txt`` and
   ``tool_calls.json`` (its call parsing on the inputs in :data:`CALL_INPUTS`), and
   ``list_tools.edge_tools.txt`` for the made-up corner cases in ``edge_tools.json``.

Only ``library_1.tools.json`` (our own scenario) is kept in the repository; the content_platform_1
tools come from the AWM-1K sample at test time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SCENARIOS = {
    "library_1": REPO / "data" / "awm_scenarios",
    "content_platform_1": REPO.parent / "shared" / "data" / "awm1k_samples",
}

#: Assistant texts whose parse by the official agent is recorded in ``tool_calls.json``.
CALL_INPUTS = [
    '<tool_call>\n{"name": "list_tools", "arguments": null}\n</tool_call>',
    '<tool_call>\n{"name": "call_tool", "arguments": {"tool_name": "mcp_tool_search_channels", '
    '"arguments": "{\\"query\\": \\"Kurzgesagt\\"}"}}\n</tool_call>',
    # the system prompt's own example: unescaped quotes inside the JSON string
    '<tool_call>\n{"name": "call_tool", "arguments": {"tool_name": "get_weather", "arguments": "{"city": "Beijing"}"}}\n'
    "</tool_call>",
    '<tool_call>{"name": "mcp_tool_get_user", "arguments": {"user_id": 1}}</tool_call>',
    '<tool_call>\n{"name": "mcp_tool_list_items"}\n</tool_call>',
    '<tool_call>[{"name": "list_tools", "arguments": {}}]</tool_call>',
    "<tool_call>[]</tool_call>",
    '<tool_call>\n{"name": "call_tool", "arguments": "{\\"tool_name\\": \\"mcp_tool_a\\", \\"arguments\\": {\\"x\\": 2}}"}\n'
    "</tool_call>",
    '<tool_call>{"name": "call_tool", "arguments": {"tool_name": "b", "arguments": "[1, 2]"}}</tool_call>',
    '<tool_call>{"name": "call_tool", "arguments": {"tool_name": "c", "arguments": "  "}}</tool_call>',
    '<tool_call>{"name": "call_tool", "arguments": {"tool_name": "d", "arguments": 7}}</tool_call>',
    '<tool_call>{"name": "call_tool", "arguments": {"tool_name": "e", "arguments": "{\'k\': \'v\', }"}}</tool_call>',
    "<tool_call>{'name': 'call_tool', 'arguments': {'tool_name': 'f', 'arguments': '{}'}}</tool_call>",
    '<tool_call>{"name": "call_tool", "arguments": {"tool_name": "g", "arguments": "{\\"n\\": 1"}}</tool_call>',
    '<tool_call>{"name": "call_tool", "arguments": {"tool_name": "h", "arguments": {"nested": {"a": [1]}}}',
    "<tool_call>not json at all</tool_call>",
    "<tool_call>   </tool_call>",
    '<tool_call>"just a string"</tool_call>',
    '<tool_call>{"arguments": {}}</tool_call>',
    '<tool_call>{"name": "call_tool", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "call_tool"}</tool_call>',
    '<tool_call>{"name": "call_tool", "arguments": "not json"}</tool_call>',
    'I will look first.\n<tool_call>\n{"name": "list_tools", "arguments": null}\n</tool_call>\n'
    '<tool_call>\n{"name": "mcp_tool_x", "arguments": {}}\n</tool_call>',
    '<think>\nplan\n</think>\n\n<tool_call>\n{"name": "call_tool", "arguments": {"tool_name": "mcp_tool_k", '
    '"arguments": "{\\"id\\": 3, \\"note\\": \\"caf\\u00e9\\"}"}}\n</tool_call>',
    '<tool_call>{"name": "call_tool", "arguments": {"tool_name": "mcp_tool_u", "arguments": "{\\"t\\": \\"日本\\"}"}}'
    "</tool_call>",
    '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>',
    "The answer is 42.",
    "",
    '<tool_call>{"name": "list_tools", "arguments": null}',
    '<tool_call>\n{"name": "call_tool", "arguments": {"tool_name": "mcp_tool_x", '
    '"arguments": "{\\"a\\": \\"see </tool_call> here\\"}"}}\n</tool_call>',
]

#: Made-up tools covering the listing's corners (written by this script, rendered by the official code).
EDGE_TOOLS = [
    {"name": "list_tools", "description": "the meta-tool itself: left out", "inputSchema": {}},
    {"name": "mcp_tool_already_prefixed", "description": "", "inputSchema": {"type": "object", "properties": {}}},
    {
        "name": "multi_line",
        "description": "  First line.  \n\n  Second, indented.\n\n\n### Third\n  ",
        "input_schema": {
            "type": "object",
            "required": ["q"],
            "properties": {
                "q": {"type": "string", "description": "query\nover two lines"},
                "flag": {"type": "boolean", "default": False},
                "on": {"type": "boolean", "default": True, "description": ""},
                "n": {"type": "number", "default": 0.5, "enum": [0.5, 1.0]},
                "mode": {"enum": ["a", "b"], "default": "a"},
                "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                "kinds": {"type": ["string", "null"], "default": ["x"]},
                "empty_enum": {"type": "string", "enum": []},
                "filter": {
                    "type": "object",
                    "required": ["field"],
                    "properties": {
                        "field": {"type": "string", "description": "which"},
                        "range": {"type": "object", "properties": {"lo": {"type": "integer", "default": {"k": 1}}}},
                    },
                },
                "plain_object": {"type": "object"},
            },
        },
    },
    {"name": "no_schema", "description": "No input schema at all."},
    {
        "name": "unicode",
        "description": "Café — 日本",
        "inputSchema": {"properties": {"naïve": {"type": "string", "description": "ünïcode", "default": "é"}}},
    },
]


def dump_tools(out: Path) -> None:
    """Start each scenario in echo_trl's sandboxed runner and save the tool objects it lists."""
    sys.path.insert(0, str(REPO))
    from echo_trl.envs.awm import AWMRuntime, ScenarioSource

    out.mkdir(parents=True, exist_ok=True)
    for name, directory in SCENARIOS.items():
        with AWMRuntime(ScenarioSource.from_dir(directory).load(name)).start() as runtime:
            tools = runtime.tools
        (out / f"{name}.tools.json").write_text(
            json.dumps(tools, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
        )
        print(f"{name}: {len(tools)} tools -> {out / f'{name}.tools.json'}")
    # our own scenario's tools are kept beside the expectations (the fast tests read them)
    (HERE / "library_1.tools.json").write_text(
        (out / "library_1.tools.json").read_text(encoding="utf-8"), encoding="utf-8"
    )


def write_official(tools_dir: Path, out: Path) -> None:
    """What the official agent's own functions return for the same tools and call texts."""
    from awm.core import agent  # the official package; present only in its own venv

    out.mkdir(parents=True, exist_ok=True)
    (out / "system_prompt.txt").write_text(agent.get_system_prompt(), encoding="utf-8", newline="")
    for name in SCENARIOS:
        tools = json.loads((tools_dir / f"{name}.tools.json").read_text(encoding="utf-8"))
        text = agent.format_tools_for_response(tools)
        (out / f"list_tools.{name}.txt").write_text(text, encoding="utf-8", newline="")
        print(f"{name}: {len(tools)} tools, list_tools reply {len(text)} chars")
    (out / "edge_tools.json").write_text(json.dumps(EDGE_TOOLS, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (out / "list_tools.edge_tools.txt").write_text(
        agent.format_tools_for_response(EDGE_TOOLS), encoding="utf-8", newline=""
    )
    cases = []
    for text in CALL_INPUTS:
        calls = [{"name": c["name"], "arguments": c["arguments"]} for c in agent.parse_tool_calls(text)]
        resolved = [list(agent.parse_call_tool_arguments(c["arguments"])) for c in calls if c["name"] == "call_tool"]
        cases.append({"content": text, "calls": calls, "call_tool": resolved})
    (out / "tool_calls.json").write_text(json.dumps(cases, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(cases)} call-parsing cases")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    t = sub.add_parser("tools")
    t.add_argument("--out", type=Path, required=True)
    o = sub.add_parser("official")
    o.add_argument("--tools", type=Path, required=True)
    o.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    if args.step == "tools":
        dump_tools(args.out)
    else:
        write_official(args.tools, args.out)


if __name__ == "__main__":
    main()
