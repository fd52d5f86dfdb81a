"""Conversation logs with a reward (OpenEnv ``openenv collect`` results.jsonl) as trajectories.

``tests/fixtures/openenv_collect/results.jsonl`` was written by OpenEnv 0.10's own collector
(``make_results.py`` there), so the reader is tested against the real format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_trl.data.build import build_awm_dataset
from echo_trl.data.readers.conversations import conversation_to_trajectory
from echo_trl.data.readers.records import is_conversation, load_awm_episodes
from echo_trl.errors import EpisodeError
from echo_trl.roles import Role

COLLECT = Path(__file__).parents[2] / "fixtures" / "openenv_collect"


def _records() -> list[dict]:
    return [json.loads(line) for line in (COLLECT / "results.jsonl").read_text().splitlines()]


def test_openenv_collect_output_roles_from_message_roles():
    trajs, skipped = load_awm_episodes([COLLECT])  # the directory: metadata.json is not an episode
    assert not skipped and len(trajs) == 2
    t = trajs[0]
    raw = _records()[0]["messages"]
    assert t.prompt == [{"role": m["role"], "content": m["content"]} for m in raw[:2]]
    assert t.message_roles() == [Role.CONTEXT] * 2 + [Role.ACTION, Role.ENV_OUTPUT] * 2 + [Role.ACTION]
    assert [m["content"] for m in t.completion if m["role"] == "tool"] == [
        m["content"] for m in raw if m["role"] == "tool"
    ]
    assert t.completion[0]["tool_calls"] == [
        {
            "type": "function",
            "function": {"name": "find_member", "arguments": {"card": "2001-0042"}},
            "id": "call_0_2_0",
        }
    ]  # JSON-string arguments parsed, the recorded call id kept
    assert t.completion[3]["name"] == "list_loans" and t.completion[3]["tool_call_id"] == "call_0_4_0"
    assert t.completion[-1] == {"role": "assistant", "content": "Card 2001-0042 has 2 loans."}
    assert [x.reward for x in trajs] == [1.0, 0.0]
    assert {(x.scenario, x.task_idx, x.group_id) for x in trajs} == {("library_1", 3, "library_1/3")}
    assert trajs[1].completion[1]["content"] == "Error: member_id must be an integer"


def test_build_dataset_reads_conversations_beside_episodes(tmp_path):
    episode = {
        "scenario": "shop",
        "task": "t",
        "task_idx": 0,
        "reward": 0.5,
        "steps": [{"action": {"tool_name": "a", "arguments": {}}, "observation": {"tool_result": "ok"}}],
    }
    (tmp_path / "ep.json").write_text(json.dumps(episode))
    (tmp_path / "results.jsonl").write_text((COLLECT / "results.jsonl").read_text())
    ds = build_awm_dataset([tmp_path])
    assert len(ds) == 3 and ds["reward"] == [0.5, 1.0, 0.0]
    assert ds["scenario"] == ["shop", "library_1", "library_1"]


def test_without_provenance_the_prompt_is_the_group():
    def rec(task, reward):
        return {
            "messages": [{"role": "user", "content": task}, {"role": "assistant", "content": "x"}],
            "reward": reward,
        }

    a, b, c = (conversation_to_trajectory(r) for r in (rec("t1", 1), rec("t1", 0), rec("t2", 0)))
    assert a.group_id == b.group_id != c.group_id and a.group_id.startswith("prompt:")
    assert (a.scenario, a.task_idx) == ("", -1)
    extra = conversation_to_trajectory({**rec("t1", 1), "extra": {"scenario": "s", "task_idx": 4}})
    assert extra.group_id == "s/4"


def test_content_parts_tools_and_structured_tool_output():
    t = conversation_to_trajectory(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "f", "arguments": {"k": 1}}}],
                },
                {"role": "tool", "content": {"v": 2}},
            ],
            "reward": 1,
            "tools": [{"name": "f", "description": "F.", "inputSchema": {}}],
        }
    )
    assert t.prompt[0]["content"] == "ab" and t.completion[0]["content"] is None  # a call turn's None kept
    assert json.loads(t.completion[1]["content"]) == {"v": 2}
    assert t.tools[0]["function"]["name"] == "f"
    assert is_conversation({"messages": []}) and not is_conversation({"messages": [], "steps": []})


@pytest.mark.parametrize(
    "patch, error",
    [
        (lambda r: r.pop("reward"), r"reward: missing"),
        (lambda r: r.update(reward="1"), r"reward: expected a number, got a string"),
        (lambda r: r.update(reward=float("nan")), r"reward: expected a finite number"),
        (lambda r: r.update(messages={}), r"messages: expected a list of messages"),
        (lambda r: r["messages"][1].update(role="robot"), r"messages\[1\].role: unknown role 'robot'"),
        (
            lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments="{oops"),
            r"messages\[2\].tool_calls\[0\].function.arguments: arguments string is not valid JSON",
        ),
        (
            lambda r: r["messages"][2]["tool_calls"][0]["function"].update(arguments="[1]"),
            r"messages\[2\].tool_calls\[0\].function.arguments: expected an object of tool arguments, got a list",
        ),
        (
            lambda r: r["messages"][2]["tool_calls"][0].update(function=None),
            r"messages\[2\].tool_calls\[0\]: expected \{function",
        ),
        (
            lambda r: r["messages"][2]["tool_calls"][0]["function"].update(name=""),
            r"messages\[2\].tool_calls\[0\].function.name: expected a non-empty",
        ),
        (
            lambda r: r["messages"][3].update(content=[{"type": "image"}]),
            r"messages\[3\].content\[0\]: expected a text",
        ),
        (lambda r: r["messages"].__setitem__(slice(2, None), []), r"messages: no assistant turn"),
        (lambda r: r["messages"].pop(1), r"messages: no user message before the first assistant turn"),
        (lambda r: r.update(behavior_logprobs=[0.1, None]), r"behavior_logprobs\[1\]: expected a number, got null"),
        (lambda r: r.update(tools=[{"name": 5}]), r"tools\[0\].name: expected a string"),
    ],
)
def test_bad_records_are_named_one_line_errors(patch, error):
    record = _records()[0]
    patch(record)
    with pytest.raises(EpisodeError, match=r"^results.jsonl:7: " + error) as info:
        conversation_to_trajectory(record, source="results.jsonl", record_id="7")
    assert "\n" not in str(info.value)


def test_lenient_loading_keeps_the_valid_conversation_next_to_a_bad_one(tmp_path):
    good, bad = _records()
    bad["messages"][2]["tool_calls"][0]["function"]["arguments"] = "{broken"
    (tmp_path / "results.jsonl").write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(EpisodeError, match=r"results.jsonl:1: messages\[2\]"):
        load_awm_episodes([tmp_path])
    trajs, skipped = load_awm_episodes([tmp_path], strict=False)
    assert [t.reward for t in trajs] == [1.0] and len(skipped) == 1 and skipped[0].record == "1"


def test_conversations_are_taken_as_recorded_in_either_format():
    plain, _ = load_awm_episodes([COLLECT])
    agent, _ = load_awm_episodes([COLLECT], format="awm-agent")
    assert [t.messages for t in plain] == [t.messages for t in agent]
