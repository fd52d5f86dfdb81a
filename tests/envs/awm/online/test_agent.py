"""The official AWM agent's format, live: replies, a scripted model turn by turn, the two-tool TRL environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.shared_data import AWM1K_SAMPLES, require_shared
from helpers.tiny import tiny_tokenizer

from echo_trl.data.readers import awm_agent
from echo_trl.data.readers.records import load_awm_episodes
from echo_trl.envs.awm.online.agent import awm_agent_environment_factory
from echo_trl.envs.awm.policies.model import AWMAgentModelPolicy
from echo_trl.envs.awm.runtime.agent_turns import agent_reply
from echo_trl.envs.awm.runtime.pool import ServerPool
from echo_trl.envs.awm.scenario.source import ScenarioSource

REPO = Path(__file__).resolve().parents[4]
OFFICIAL = REPO / "tests" / "fixtures" / "awm_official"


@pytest.fixture(scope="module")
def pool():
    library = ScenarioSource.from_dir(REPO / "data" / "awm_scenarios").load("library_1")
    content = ScenarioSource.from_dir(require_shared(AWM1K_SAMPLES)).load("content_platform_1")
    with ServerPool(2) as p:
        p.add(library)
        p.add(content)
        yield p


@pytest.mark.parametrize("scenario", ["library_1", "content_platform_1"])
def test_live_list_tools_reply_is_the_official_agents(pool, scenario):
    ep = pool.new_episode(scenario, 0)
    reply = agent_reply(ep, awm_agent.action_for_call("list_tools"))
    assert reply == (OFFICIAL / f"list_tools.{scenario}.txt").read_text(
        encoding="utf-8"
    )  # written by agent-world-model
    assert ep.steps == []  # the listing is context, not a scenario step
    ep.close()


def test_call_tool_replies_as_the_official_agent(pool):
    ep = pool.new_episode("library_1", 0)
    # prefix stripped, arguments a JSON string the official agent would repair (single quotes)
    act = awm_agent.action_for_call(
        "call_tool", {"tool_name": "mcp_tool_search_members", "arguments": "{'query': 'Priya Raman'}"}
    )
    assert '"full_name": "Priya Raman"' in agent_reply(ep, act)
    bad = agent_reply(
        ep, awm_agent.action_for_call("call_tool", {"tool_name": "mcp_tool_get_book", "arguments": '{"book_id": "x"}'})
    )
    assert bad.startswith("Error: ") and bad[len("Error: ") :] == ep.steps[-1]["observation"]["error"]
    unknown = agent_reply(ep, awm_agent.action_for_call("search_books", {"query": "x"}))
    assert unknown == awm_agent.unknown_tool_text("search_books")
    assert [s["observation"]["reward_type"] for s in ep.steps] == ["tool_call_ok", "invalid_args", "tool_not_found"]
    assert not ep.done and ep.format_errors == 2
    ep.close()


class Scripted(AWMAgentModelPolicy):
    """The model's turns are given (the loop, parsing and replies are the real ones)."""

    turns: tuple[str, ...] = ()

    def _generate(self, messages, tools):
        assert tools is None  # the official agent gives the chat template no tool schemas
        self.seen = messages
        text = self.turns[self._calls]
        self._calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [], ids, [-0.5] * len(ids)


def test_a_model_policy_plays_in_the_official_format(pool, tmp_path):
    turns = (
        '<tool_call>\n{"name": "list_tools", "arguments": null}\n</tool_call>',
        '<tool_call>\n{"name": "call_tool", "arguments": {"tool_name": "mcp_tool_search_members", '
        '"arguments": "{\\"query\\": \\"Priya Raman\\"}"}}\n</tool_call>',
        # a direct mcp_tool_ call is folded into call_tool; the second block of the turn is ignored
        '<tool_call>{"name": "mcp_tool_checkout_copy", "arguments": {"member_id": 1, '
        '"barcode": "31994002104119"}}</tool_call><tool_call>{"name": "list_tools"}</tool_call>',
        '<tool_call>{"name": "checkout", "arguments": {}}</tool_call>',
        "Checked out Project Hail Mary to Priya Raman.",
    )
    policy = Scripted(None, tiny_tokenizer("qwen3"), max_steps=8)
    policy.turns = turns
    ep = pool.new_episode("library_1", 0)
    policy.play(ep)
    ep.close()
    assert policy.seen[0] == {"role": "system", "content": awm_agent.SYSTEM_PROMPT}
    assert policy.seen[3]["content"] == awm_agent.list_tools_reply(ep.runtime.tools)
    assert policy.seen[-1]["content"] == awm_agent.unknown_tool_text("checkout")
    assert [s["action"]["tool_name"] for s in ep.steps] == ["search_members", "checkout_copy", "checkout", "verify"]
    assert ep.steps[-1]["action"]["arguments"]["final_answer"] == turns[-1]
    assert ep.verifier_reward == 1.0 and ep.reward == -1.0  # the task got done; the format error keeps it at -1
    assert (
        len(ep.behavior_logprobs)
        == sum(len(s["policy"]["token_ids"]) for s in ep.steps)
        + len(tiny_tokenizer("qwen3").encode(turns[0], add_special_tokens=False))
        + 1
    )
    (tmp_path / "e.jsonl").write_text(json.dumps(ep.record("omit")) + "\n")
    (traj,), _ = load_awm_episodes([tmp_path], format="awm-agent")
    assert traj.completion[1]["content"] == awm_agent.list_tools_reply(ep.runtime.tools)
    assert traj.completion[-1] == {"role": "assistant", "content": turns[-1]}
    assert traj.completion[-2]["content"] == awm_agent.unknown_tool_text("checkout")


def test_the_online_environment_has_exactly_the_two_meta_tools(pool):
    import inspect

    from transformers.utils import get_json_schema

    factory = awm_agent_environment_factory(
        [pool.scenario("library_1"), pool.scenario("content_platform_1")], pool=pool
    )
    cls = factory.environment_class
    tools = [
        n
        for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not n.startswith("_") and n not in ("reset", "get_reward")
    ]
    assert tools == ["call_tool", "list_tools"]
    for schema in awm_agent.meta_tool_schemas():  # TRL describes them exactly as the official prompt does
        derived = get_json_schema(getattr(cls, schema["function"]["name"]))["function"]
        assert {k: derived[k] for k in ("name", "description", "parameters")} == schema["function"]
    env = factory()
    env.reset(scenario="content_platform_1", task_idx=0, prompt=[{"role": "user", "content": "t"}])
    assert env.list_tools() == (OFFICIAL / "list_tools.content_platform_1.txt").read_text(encoding="utf-8")
    assert "Kurzgesagt" in env.call_tool("mcp_tool_search_channels", '{"query": "Kurzgesagt"}')
    assert env.get_reward() == 0.0 and "verification" in env._episode_record()  # verifier kept out of the chat
    env.reset(scenario="library_1", task_idx=0)  # the same instance, another scenario
    env.call_tool("mcp_tool_search_members", {"query": "Priya Raman"})  # arguments as an object work too
    env.call_tool("mcp_tool_checkout_copy", '{"member_id": 1, "barcode": "31994002104119"}')
    assert env.get_reward() == 1.0
    with pytest.raises(Exception, match="'nope' is not in the pool"):
        env.reset(scenario="nope", task_idx=0)
    with pytest.raises(ValueError, match="use verify_turn='omit'"):
        awm_agent_environment_factory([], pool=pool, verify_turn="env_output")
