"""The official AWM agent's format: byte-identical to what ``agent-world-model`` 0.1.0 produces.

Expectations in ``tests/fixtures/awm_official/`` were written by the official package's own functions
(``make_expected.py``; see the README there), never by echo_trl.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.tiny import tiny_tokenizer
from hypothesis import given
from hypothesis import strategies as st

from echo_trl.data.readers import awm_agent as A
from echo_trl.data.readers.records import awm_episode_to_trajectory
from echo_trl.data.schema import row_to_trajectory, trajectory_to_row
from echo_trl.errors import EpisodeError
from echo_trl.roles import Role

OFFICIAL = Path(__file__).parents[2] / "fixtures" / "awm_official"


def _read(name: str) -> str:
    return (OFFICIAL / name).read_bytes().decode("utf-8")


def _tools(name: str) -> list[dict]:
    return json.loads(_read(name))


def test_system_prompt_is_the_official_one_byte_for_byte():
    assert _read("system_prompt.txt") == A.SYSTEM_PROMPT
    assert A.SYSTEM_PROMPT.startswith("        # MCP Toolss\n\n")  # its own indentation and typo


@pytest.mark.parametrize(
    "tools, expected",
    [("library_1.tools.json", "list_tools.library_1.txt"), ("edge_tools.json", "list_tools.edge_tools.txt")],
)
def test_list_tools_reply_is_the_official_one(tools, expected):
    assert A.list_tools_reply(_tools(tools)) == _read(expected)


def test_list_tools_reply_corners():
    assert A.list_tools_reply([]) == "Available MCP Tools (0 tools):\n" + "=" * 80
    assert len(_tools("library_1.tools.json")) == 21
    reply = A.list_tools_reply(_tools("library_1.tools.json"))
    assert reply.startswith("Available MCP Tools (21 tools):") and reply.count("\n   Description: ") == 21
    assert "mcp_tool_mcp_tool_" not in A.list_tools_reply(_tools("edge_tools.json"))


def test_call_parsing_matches_the_official_agent_on_every_recorded_case():
    cases = json.loads(_read("tool_calls.json"))
    assert len(cases) >= 25
    for case in cases:
        calls = A.parse_tool_calls(case["content"])
        assert [{"name": c.name, "arguments": c.arguments} for c in calls] == case["calls"], case["content"]
        resolved = [list(A.parse_call_tool_arguments(c.arguments)) for c in calls if c.name == A.CALL_TOOL]
        assert resolved == case["call_tool"], case["content"]


def test_next_action_dispatches_like_the_official_loop():
    assert A.next_action("All done: 3 loans.") == A.AgentAction("final")
    assert A.next_action("<tool_call>not json</tool_call>").kind == "final"  # unreadable call = the answer
    assert A.next_action('<tool_call>{"name": "list_tools", "arguments": null}</tool_call>').kind == "list_tools"
    act = A.next_action(
        '<tool_call>{"name": "mcp_tool_get_user", "arguments": {"id": 1}}</tool_call>\n'
        '<tool_call>{"name": "list_tools"}</tool_call>'
    )
    assert (act.kind, act.tool_name, act.arguments, act.ignored) == ("call_tool", "get_user", {"id": 1}, 1)
    act = A.next_action('<tool_call>{"name": "weather", "arguments": {}}</tool_call>')
    assert (act.kind, act.name) == ("unknown", "weather")
    assert A.unknown_tool_text(act.name) == (
        "Error: Unknown tool 'weather'. Only 'list_tools' and 'call_tool' are available."
    )
    # structured calls (a chat template's parser): arguments as an object or a JSON string
    assert A.action_for_call("call_tool", {"tool_name": "mcp_tool_a", "arguments": '{"x": 1}'}).arguments == {"x": 1}
    assert A.action_for_call("call_tool", '{"tool_name": "b"}').tool_name == "b"
    assert A.action_for_call("mcp_tool_c", None) == A.AgentAction("call_tool", "call_tool", "c", {})


def test_call_text_round_trips_through_the_parser():
    text = A.tool_call_text("call_tool", {"tool_name": "mcp_tool_x", "arguments": json.dumps({"q": "日本"})})
    assert text.startswith("<tool_call>\n{") and text.endswith("}\n</tool_call>")
    assert A.next_action(text) == A.AgentAction("call_tool", "call_tool", "x", {"q": "日本"})


def test_robust_json_loads():
    assert A.robust_json_loads("  ") == {} and A.robust_json_loads("") == {}
    assert A.robust_json_loads('{"a": 1,}') == {"a": 1}  # repaired
    assert A.robust_json_loads('{"a": "\ud800x"}') == {"a": "x"}  # a lone surrogate is dropped
    # NaN / Infinity cannot be recorded in strict JSON: such a call reads as unreadable ({}), as the official
    # agent's json_repair reads text it cannot parse; so do hundreds of unclosed or ~990 nested brackets (issue 32)
    assert A.robust_json_loads("NaN") == {} and A.robust_json_loads('{"q": Infinity}') == {}
    assert A.robust_json_loads("[" * 400) == {} and A.robust_json_loads("[" * 990 + "]" * 990) == {}
    assert A.robust_json_loads('{"q": "\\ud800"}') == {"q": "\ufffd"}  # an escaped lone surrogate: replaced
    assert A.robust_json_loads(["[1]", "{}"]) == [[1], {}]


def test_robust_json_loads_never_reads_a_file(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "s3cr3t"}')
    assert "s3cr3t" not in json.dumps(A.robust_json_loads(str(secret)))


def test_error_texts():
    assert A.error_text("404 not found") == "Error: 404 not found"
    assert A.timeout_text(60) == "Error: Tool call timed out after 60.0s"
    assert A.tool_reply_text(["a", "b"], is_error=False) == "a\nb"
    assert A.tool_reply_text(["boom"], is_error=True) == "Error: boom"


def test_meta_tool_schemas_say_what_the_system_prompt_says():
    schemas = A.meta_tool_schemas()
    assert [s["function"]["name"] for s in schemas] == ["list_tools", "call_tool"]
    call = schemas[1]["function"]["parameters"]
    assert call["required"] == ["tool_name", "arguments"]
    assert {p["type"] for p in call["properties"].values()} == {"string"}
    prompt = _read("system_prompt.txt")
    texts = [
        schemas[0]["function"]["description"],
        schemas[1]["function"]["description"],
        *(p["description"] for p in call["properties"].values()),
    ]
    assert all(t in prompt for t in texts)
    schemas[0]["function"]["name"] = "changed"
    assert A.meta_tool_schemas()[0]["function"]["name"] == "list_tools"  # a fresh copy each call


def _episode(**overrides):
    tools = _tools("library_1.tools.json")
    ep = {
        "scenario": "library_1",
        "task": "Check out a copy for member 3.",
        "task_idx": 0,
        "tools": tools,
        "reward": 1.0,
        "steps": [
            {
                "action": {"tool_name": "search_catalog", "arguments": {"query": "Hail Mary"}},
                "observation": {"tool_result": '{"books": []}', "warning": "7 steps left"},
            },
            {
                "action": {"tool_name": "checkout_copy", "arguments": {"barcode": 5}},
                "observation": {"error": "422: barcode must be a string"},
            },
            {
                "action": {"tool_name": "verify", "arguments": {"verifier_mode": "code", "final_answer": "Done."}},
                "observation": {"verify_result": {"result": "complete", "raw_result": {"answer": "secret"}}},
            },
        ],
    }
    ep.update(overrides)
    return ep


def test_recorded_episode_becomes_the_official_conversation():
    t = awm_episode_to_trajectory(_episode(), format="awm-agent")
    assert t.prompt == [
        {"role": "system", "content": _read("system_prompt.txt")},
        {"role": "user", "content": "Check out a copy for member 3."},
    ]
    assert [m["role"] for m in t.completion] == ["assistant", "tool"] * 3 + ["assistant"]
    assert t.message_roles() == [Role.CONTEXT] * 2 + [Role.ACTION, Role.ENV_OUTPUT] * 3 + [Role.ACTION]
    assert t.completion[0]["tool_calls"][0]["function"] == {"name": "list_tools", "arguments": {}}
    assert t.completion[1]["content"] == _read("list_tools.library_1.txt")
    assert t.completion[2]["tool_calls"][0]["function"] == {
        "name": "call_tool",
        "arguments": {"tool_name": "mcp_tool_search_catalog", "arguments": '{"query": "Hail Mary"}'},
    }
    assert t.completion[3]["content"] == '{"books": []}'
    assert t.completion[5]["content"] == "Error: 422: barcode must be a string"
    assert t.completion[6] == {"role": "assistant", "content": "Done."}
    assert "secret" not in json.dumps(t.completion)  # the verifier is omitted by default
    assert t.warnings[3] == ["7 steps left"] and sum(map(len, t.warnings)) == 1
    assert t.tools == A.meta_tool_schemas() and t.reward == 1.0 and t.group_id == "library_1/0"


def test_verify_turn_env_output_puts_the_verifier_after_the_answer():
    t = awm_episode_to_trajectory(_episode(), format="awm-agent", verify_turn="env_output")
    assert [m["role"] for m in t.completion[-2:]] == ["assistant", "tool"]
    assert json.loads(t.completion[-1]["content"])["raw_result"] == {"answer": "secret"}
    assert t.message_roles()[-1] == Role.ENV_OUTPUT


def test_without_a_final_answer_the_conversation_ends_with_the_last_reply():
    ep = _episode()
    ep["steps"] = ep["steps"][:1]
    t = awm_episode_to_trajectory(ep, format="awm-agent")
    assert [m["role"] for m in t.completion] == ["assistant", "tool", "assistant", "tool"]


def test_trajectory_json_shape_uses_the_listed_tools():
    listed = _tools("edge_tools.json")
    ep = {
        "scenario": "s",
        "task": "t",
        "task_idx": 1,
        "trajectory": [
            {"action": "list_tools", "result": listed},
            {"action": "call_tool", "tool_name": "no_schema", "arguments": "{}", "success": False, "error": "boom"},
            {"action": "verify", "verify_result": {"result": "others"}, "reward_type": "others", "reward": 0.0},
        ],
    }
    t = awm_episode_to_trajectory(ep, format="awm-agent")
    assert t.completion[1]["content"] == _read("list_tools.edge_tools.txt")
    assert t.completion[3]["content"] == "Error: boom" and len(t.completion) == 4


def test_tools_the_listing_cannot_show_are_named_errors():
    with pytest.raises(EpisodeError, match=r"ep.json:3: tools\[1\]: a tool name only"):
        awm_episode_to_trajectory(
            _episode(tools=[{"name": "a"}, "b"]), format="awm-agent", source="ep.json", record="3"
        )
    with pytest.raises(EpisodeError, match=r"tools: missing"):
        awm_episode_to_trajectory(_episode(tools=None), format="awm-agent")
    with pytest.raises(EpisodeError, match=r"tools\[0\].name: expected a string"):
        awm_episode_to_trajectory(_episode(tools=[{"name": 3}]), format="awm-agent")
    # OpenAI-style schemas go back to MCP objects
    openai = [{"type": "function", "function": {"name": "x", "description": "X.", "parameters": {}}}]
    t = awm_episode_to_trajectory(_episode(tools=openai), format="awm-agent")
    assert t.completion[1]["content"] == A.list_tools_reply([{"name": "x", "description": "X.", "inputSchema": {}}])


def test_awm_agent_rows_render_without_tool_schemas_and_roles_follow():
    t = awm_episode_to_trajectory(_episode(), format="awm-agent")
    row = trajectory_to_row(t, "awm-agent")
    assert len(row["tools"]) == 2 and row["format"] == "awm-agent"
    assert row_to_trajectory(row).tools == []  # the official agent gives its model no tool schemas
    from echo_trl.tokens.tokenization import tokenize_with_roles

    tok = tiny_tokenizer("qwen3")
    rt = tokenize_with_roles(tok, row)
    assert A.SYSTEM_PROMPT in rt.text and "<tools>\n{" not in rt.text  # no template tool block
    env = tok.decode([i for i, m in zip(rt.input_ids, rt.env_output_mask, strict=True) if m])
    assert _read("list_tools.library_1.txt")[:200] in env and "Error: 422" in env
    action = tok.decode([i for i, m in zip(rt.input_ids, rt.action_mask, strict=True) if m])
    assert "mcp_tool_search_catalog" in action and "Done." in action and "Available MCP Tools" not in action


def test_content_platform_1_episode_holds_the_official_prompt_and_listing(tmp_path, awm1k_samples):
    """Acceptance, as an AWM user: capture on the AWM-1K sample, build --format awm-agent, compare bytes."""
    from echo_trl.commands.cli import main as cli
    from echo_trl.data.store import load_echo_dataset

    replay = tmp_path / "replay.jsonl"
    replay.write_text(
        json.dumps(
            {
                "task_idx": 0,
                "calls": [
                    {"tool_name": "search_channels", "arguments": {"query": "Kurzgesagt"}},
                    {"tool_name": "subscribe_to_channel", "arguments": {"channel_id": "one"}},
                ],
                "final_answer": "Subscribed.",
            }
        )
        + "\n"
    )
    assert (
        cli(
            [
                "capture",
                "--data",
                str(awm1k_samples),
                "--scenario",
                "content_platform_1",
                "--task-idx",
                "0",
                "--policy",
                f"replay:{replay}",
                "--output",
                str(tmp_path / "eps"),
            ]
        )
        == 0
    )
    assert (
        cli(["build-dataset", str(tmp_path / "eps"), "--output", str(tmp_path / "ds"), "--format", "awm-agent"]) == 0
    )
    (row,) = load_echo_dataset(tmp_path / "ds").to_list()
    assert row["format"] == "awm-agent"
    assert row["prompt"][0]["content"] == _read("system_prompt.txt")
    assert row["completion"][1]["content"] == _read("list_tools.content_platform_1.txt")  # all 34 tools
    assert _read("list_tools.content_platform_1.txt").startswith("Available MCP Tools (34 tools):")
    call = row["completion"][2]["tool_calls"][0]["function"]
    assert call["name"] == "call_tool" and json.loads(call["arguments"]) == {
        "tool_name": "mcp_tool_search_channels",
        "arguments": '{"query": "Kurzgesagt"}',
    }
    rec = json.loads((tmp_path / "eps" / "content_platform_1_task0.jsonl").read_text().splitlines()[0])
    assert row["completion"][3]["content"] == rec["steps"][0]["observation"]["tool_result"]
    error = rec["steps"][1]["observation"]["error"]  # a wrong-type argument: the server's validation error
    assert "integer" in error and row["completion"][5]["content"] == "Error: " + error
    assert all(m["name"] != "verify" for m in row["completion"])  # verifier omitted by default
    assert [json.loads(t)["function"]["name"] for t in row["tools"]] == ["list_tools", "call_tool"]


def test_custom_system_prompt_and_steps_after_the_verifier():
    ep = _episode()
    ep["steps"].append(
        {
            "action": {"tool_name": "search_catalog", "arguments": {}},
            "observation": {"error": "the episode has ended; start a new episode"},
        }
    )
    t = awm_episode_to_trajectory(
        ep, format="awm-agent", system_prompt="Desk of {scenario} {not a field}", verify_turn="env_output"
    )
    assert t.prompt[0]["content"] == "Desk of library_1 {not a field}"  # braces are text
    roles = [m["role"] for m in t.completion]
    assert roles[6:] == ["assistant", "tool", "assistant", "tool"]  # answer + verifier where they happened
    assert t.completion[6]["content"] == "Done." and t.completion[7]["name"] == "verify"
    assert awm_episode_to_trajectory(ep, format="awm-agent", system_prompt=None).prompt[0]["role"] == "user"


_text = st.text().filter(lambda t: "</tool_call>" not in t)  # the official block regex cannot hold it
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


@given(
    name=st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True),
    arguments=st.dictionaries(_text, _json_values, max_size=4),
)
def test_any_call_the_format_writes_parses_back(name, arguments):
    message = A.call_tool_message(name, arguments)
    call = message["tool_calls"][0]["function"]
    action = A.next_action(A.tool_call_text(call["name"], call["arguments"]))
    assert (action.kind, action.tool_name, action.arguments) == ("call_tool", name, arguments)


def test_a_closing_tag_inside_arguments_cuts_the_call_as_in_the_official_agent():
    call = A.call_tool_message("x", {"a": "see </tool_call> here"})["tool_calls"][0]["function"]
    assert A.next_action(A.tool_call_text(call["name"], call["arguments"])).arguments == {"a": "see"}
