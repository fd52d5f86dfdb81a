"""AWM episode readers: both recorded shapes, tools, roles, and named validation errors."""

from __future__ import annotations

import json

import pytest
from helpers.episodes import openenv_episode, session_episode

from echo_trl.data.readers.records import awm_episode_to_trajectory, load_awm_episodes
from echo_trl.data.readers.tools import tool_schema
from echo_trl.errors import EpisodeError
from echo_trl.roles import Role


def test_openenv_shape_maps_each_field_to_its_role():
    t = awm_episode_to_trajectory(openenv_episode())
    assert [m["role"] for m in t.prompt] == ["system", "user"]
    assert t.prompt[1]["content"] == "Add a notebook to my cart."
    assert t.message_roles() == [Role.CONTEXT, Role.CONTEXT] + [Role.ACTION, Role.ENV_OUTPUT] * 3
    calls = [m["tool_calls"][0]["function"] for m in t.completion if m["role"] == "assistant"]
    assert calls == [
        {"name": "search", "arguments": {"q": "notebook"}},
        {"name": "add_to_cart", "arguments": {"id": "x"}},
        {"name": "verify", "arguments": {"verifier_mode": "code"}},
    ]
    outputs = [m["content"] for m in t.completion if m["role"] == "tool"]
    assert outputs[0] == '{"items": [{"id": 7}]}'
    assert outputs[1] == "422: id must be an integer"
    assert json.loads(outputs[2]) == {"result": "others"}
    # The warning is kept apart: not in any message text, attached to the tool message it came with.
    assert all("3 steps left" not in m["content"] for m in t.messages)
    assert t.warnings == [[], ["3 steps left"], [], [], [], []]
    assert (t.reward, t.scenario, t.task_idx, t.group_id) == (0.0, "shop_1", 2, "shop_1/2")


def test_session_trajectory_shape_uses_list_tools_and_last_reward():
    t = awm_episode_to_trajectory(session_episode())
    assert [tool["function"]["name"] for tool in t.tools] == ["get_item"]
    assert t.tools[0]["function"]["parameters"]["properties"] == {"id": {"type": "integer"}}
    outputs = [m["content"] for m in t.completion if m["role"] == "tool"]
    assert json.loads(outputs[0]) == {"id": 7, "title": "Notebook"}
    assert outputs[1] == "404 not found"
    assert json.loads(outputs[2]) == {"result": "complete"}
    assert t.completion[2]["tool_calls"][0]["function"]["arguments"] == {"id": 99}
    assert t.reward == 1.0


def test_non_string_results_serialise_deterministically():
    ep = openenv_episode()
    ep["steps"][0]["observation"]["tool_result"] = {"b": [1, 2], "a": "é"}
    a = awm_episode_to_trajectory(ep).completion[1]["content"]
    b = awm_episode_to_trajectory(json.loads(json.dumps(ep))).completion[1]["content"]
    assert a == b and json.loads(a) == {"b": [1, 2], "a": "é"} and "é" in a


def test_tools_accept_names_mcp_objects_and_openai_schemas():
    mcp = {"name": "f", "description": "d", "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}}
    openai = {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}}
    assert tool_schema("h")["function"]["name"] == "h"
    assert tool_schema(mcp) == {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": mcp["inputSchema"]},
    }
    assert tool_schema(openai) is openai


def test_real_captured_episode(captured_episode):
    (t,), skipped = load_awm_episodes([captured_episode])
    raw = json.loads(captured_episode.read_text())
    assert skipped == []
    assert t.scenario == "e_commerce_33" and t.task_idx == 0 and t.reward == raw["reward"]
    assert len(t.completion) == 2 * len(raw["steps"])
    assert [m["content"] for m in t.completion if m["role"] == "tool"][:-1] == [
        s["observation"]["tool_result"] for s in raw["steps"][:-1]
    ]
    assert len(t.tools) == len(raw["tools"])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda e: e["steps"][1]["action"].update(tool_name=None),
            "steps[1].action.tool_name: expected a string, got null",
        ),
        (lambda e: e.pop("task"), "task: missing"),
        (lambda e: e.update(steps=[]), "steps: episode has no tool calls"),
        (lambda e: e["steps"][0].pop("observation"), "steps[0].observation: missing"),
        (lambda e: e["steps"][0].pop("action"), "steps[0].action: missing"),
        (
            lambda e: e["steps"][2]["observation"].pop("verify_result"),
            "steps[2].observation: expected one of tool_result, error, verify_result",
        ),
        (
            lambda e: e["steps"][0]["action"].update(arguments=[1]),
            "steps[0].action.arguments: expected an object of tool arguments, got a list",
        ),
        (
            lambda e: e["steps"][0]["action"].update(arguments="{not json"),
            "steps[0].action.arguments: arguments string is not valid JSON",
        ),
        (lambda e: e.update(reward="high"), "reward: expected a number, got a string"),
        (lambda e: e.update(task_idx="0"), "task_idx: expected an integer, got a string"),
        (lambda e: e.update(tools=[{"description": "no name"}]), "tools[0].name: missing"),
        (
            lambda e: e["steps"][0]["observation"].update(warning=[1]),
            "steps[0].observation.warning[0]: expected a string, got an integer",
        ),
        (lambda e: e.update(behavior_logprobs=[0.1, None]), "behavior_logprobs[1]: expected a number, got null"),
    ],
)
def test_each_malformed_field_gets_a_named_error(mutate, message):
    ep = openenv_episode()
    mutate(ep)
    with pytest.raises(EpisodeError) as err:
        awm_episode_to_trajectory(ep, source="episodes.jsonl", record="17")
    assert str(err.value).startswith(f"episodes.jsonl:17: {message}")


def test_unknown_session_action_is_named():
    ep = session_episode()
    ep["trajectory"][1]["action"] = "teleport"
    with pytest.raises(EpisodeError, match=r"trajectory\[1\]\.action: unknown action 'teleport'"):
        awm_episode_to_trajectory(ep)


def test_lenient_loading_keeps_valid_records_and_reports_bad_lines(tmp_path):
    good = json.dumps(openenv_episode())
    lines = [
        good,
        "{not json",
        json.dumps(openenv_episode(reward=None, task_idx=None)),
        '{"scenario": "a", "scenario": "b"}',
        good.replace('"reward": 0.0', '"reward": NaN'),
        good,
    ]
    path = tmp_path / "episodes.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(EpisodeError, match=r"episodes.jsonl:2: invalid JSON"):
        load_awm_episodes([path])
    kept, skipped = load_awm_episodes([path], strict=False)
    assert len(kept) == 2
    assert [s.record for s in skipped] == ["2", "3", "4", "5"]
    assert "task_idx: expected an integer, got null" in skipped[1].reason
    assert "duplicate key 'scenario'" in skipped[2].reason
    assert "NaN" in skipped[3].reason
    assert skipped[0].raw == "{not json"


def test_invalid_utf8_is_named_and_neighbours_survive(tmp_path):
    path = tmp_path / "eps.jsonl"
    path.write_bytes(json.dumps(openenv_episode()).encode() + b"\n" + b'{"task": "\xff"}\n')
    kept, skipped = load_awm_episodes([path], strict=False)
    assert len(kept) == 1 and skipped[0].record == "2" and "invalid UTF-8" in skipped[0].reason


def test_directories_are_read_in_sorted_order(tmp_path):
    for name, idx in [("b.json", 1), ("a.json", 0), ("sub/c.jsonl", 2)]:
        p = tmp_path / name
        p.parent.mkdir(exist_ok=True)
        p.write_text(json.dumps(openenv_episode(task_idx=idx)))
    kept, _ = load_awm_episodes([tmp_path])
    assert [t.task_idx for t in kept] == [0, 1, 2]
    with pytest.raises(EpisodeError, match="no such file"):
        load_awm_episodes([tmp_path / "missing"])


# --------------------------------------------------------------------------------------------
# The bad-input corpus (tests/fixtures/bad_episodes, regenerated by its make_corpus.py)

CORPUS = __import__("pathlib").Path(__file__).parents[2] / "fixtures" / "bad_episodes"
CASES = dict(line.split("\t", 1) for line in (CORPUS / "cases.tsv").read_text().splitlines())


def test_corpus_is_large_enough():
    assert len(CASES) >= 30 and all((CORPUS / name).exists() for name in CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_episode_strict_error_names_file_record_and_field(name):
    path = CORPUS / name
    with pytest.raises(EpisodeError) as err:
        load_awm_episodes([path])
    where = f"{path}:[0]: " if name == "list_of_numbers.json" else f"{path}: "
    assert str(err.value).startswith(where + CASES[name]), str(err.value)[:300]


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_episode_lenient_keeps_the_valid_episode_beside_it(name):
    kept, skipped = load_awm_episodes([CORPUS / name, CORPUS / "good"], strict=False)
    assert [t.prompt[-1]["content"] for t in kept] == ["Add a notebook to my cart."]
    assert skipped and all(s.source == str(CORPUS / name) for s in skipped)
    assert CASES[name] in skipped[0].reason


@pytest.mark.parametrize(
    "output",
    [
        "x" * 2_000_000,  # huge
        "\x00\x01\x7f binary-ish \ufffd \x1b[31m",  # control characters and escapes
        json.loads("[" * 200 + "]" * 200),  # deeply nested (but parseable) structure
        {"ü": "日本語", "emoji": "🙂"},
    ],
)
def test_weird_but_valid_outputs_are_kept_verbatim(output):
    ep = openenv_episode()
    ep["steps"][0]["observation"]["tool_result"] = output
    t = awm_episode_to_trajectory(json.loads(json.dumps(ep)))
    content = t.completion[1]["content"]
    assert content == output if isinstance(output, str) else json.loads(content) == output


def test_compact_tools_drop_only_the_response_documentation():
    described = {
        "name": "get",
        "description": "Get a book\n\nBy id.\n\n### Responses:\n\n**200**: ok\n```json\n{}\n```",
        "inputSchema": {"type": "object", "properties": {"id": {"type": "integer"}}},
    }
    ep = openenv_episode(tools=[described, "plain"])
    full = awm_episode_to_trajectory(ep).tools
    compact = awm_episode_to_trajectory(ep, compact_tools=True).tools
    assert full[0]["function"]["description"] == described["description"]
    assert compact[0]["function"]["description"] == "Get a book\n\nBy id."
    assert compact[0]["function"]["parameters"] == described["inputSchema"] and compact[1] == full[1]


@pytest.mark.parametrize("prompt", ["Use {tools}.", "A lone { brace", "{0} and {{x}}"])
def test_braces_in_the_system_prompt_are_text_and_only_scenario_is_filled(prompt, tmp_path):
    path = tmp_path / "e.json"
    path.write_text(json.dumps(openenv_episode()))
    (t,), _ = load_awm_episodes([path], system_prompt=prompt + " in {scenario}")
    assert t.prompt[0]["content"] == prompt + " in shop_1"


def test_an_answer_without_any_tool_call_is_an_episode():
    ep = openenv_episode()
    ep["steps"] = []
    with pytest.raises(EpisodeError, match="no tool calls and no final_answer"):
        awm_episode_to_trajectory(ep)
    ep["final_answer"] = "I could not find it."
    t = awm_episode_to_trajectory(ep, verify_turn="omit")
    assert t.completion == [{"role": "assistant", "content": "I could not find it."}]
    ep["tools"] = [{"name": "search", "description": "Search.", "inputSchema": {"type": "object", "properties": {}}}]
    agent = awm_episode_to_trajectory(ep, format="awm-agent")
    assert agent.completion[-1] == {"role": "assistant", "content": "I could not find it."}


def test_final_answer_and_failed_calls_reach_the_awm_agent_format():
    ep = session_episode()
    ep["final_answer"] = "Item 7 is a notebook."
    t = awm_episode_to_trajectory(ep, format="awm-agent")
    replies = [m["content"] for m in t.completion if m["role"] == "tool"]
    assert replies[1:] == ['{\n  "id": 7,\n  "title": "Notebook"\n}', "Error: 404 not found"]
    assert t.completion[-1] == {"role": "assistant", "content": "Item 7 is a notebook."}
    ep["final_answer"] = 42
    with pytest.raises(EpisodeError, match=r"^x.json: final_answer: expected a string, got an integer"):
        awm_episode_to_trajectory(ep, format="awm-agent", source="x.json")


def test_real_captured_episode_lists_tool_names_only(captured_episode):
    # e_commerce_33's capture kept tool names only: the official listing cannot be rebuilt from them.
    with pytest.raises(EpisodeError, match=r"e_commerce_33_task0_captured.json: tools\[0\]: a tool name only"):
        load_awm_episodes([captured_episode], format="awm-agent")
    (t,), _ = load_awm_episodes([captured_episode], verify_turn="omit")
    assert all(c["function"]["name"] != "verify" for m in t.completion for c in m.get("tool_calls", []))
