"""The verifier is never one of the agent's reachable tools, in either conversation format.

The scenario here is ``library_already_satisfied`` (tests/helpers/awm_defects.py): its task 0 verifier passes on
the untouched database, so any call that reached the verifier would end the episode at once with "complete" and
reward 1.0. A call named ``verify`` must instead be an unknown tool (a format error), the episode going on.
"""

from __future__ import annotations

import re

import pytest
from helpers.awm_defects import defective_scenarios, write_scenarios

from echo_trl.data.readers import awm_agent
from echo_trl.envs.awm.online.agent import awm_agent_environment_factory
from echo_trl.envs.awm.policies.policy import live_prompt
from echo_trl.envs.awm.runtime.agent_turns import agent_reply
from echo_trl.envs.awm.runtime.pool import ServerPool
from echo_trl.envs.awm.scenario.source import ScenarioSource

NAME = "library_already_satisfied"
pytestmark = [pytest.mark.slow, pytest.mark.sandbox]  # starts contained scenario servers and verifier processes


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    data = write_scenarios(tmp_path_factory.mktemp("satisfied"), {NAME: defective_scenarios()[NAME]})
    with ServerPool(1) as p:
        p.add(ScenarioSource.from_dir(data).load(NAME))
        yield p


def _not_verified(episode) -> None:
    assert not episode.done and episode.reward is None
    assert episode.steps[-1]["observation"]["reward_type"] == "tool_not_found"
    assert all(s["action"]["tool_name"] != "verify" or "tool_name" in s["observation"] for s in episode.steps)


def test_chat_template_offers_no_verify_tool_and_a_verify_call_is_an_unknown_tool(pool):
    episode = pool.new_episode(NAME, 0)
    try:
        _, tools = live_prompt(None, episode)  # what a capture policy gives the chat template
        names = [t["function"]["name"] for t in tools]
        assert len(names) == len(pool.tools(NAME)) and "verify" not in names
        episode.call_tool("verify", {"final_answer": "done"})  # what a policy does with a call named verify
        _not_verified(episode)
    finally:
        episode.close()


def test_awm_agent_lists_no_verify_tool_and_cannot_call_it(pool):
    episode = pool.new_episode(NAME, 0)
    try:
        listing = agent_reply(episode, awm_agent.action_for_call(awm_agent.LIST_TOOLS))
        listed = re.findall(r"^\d+\. (\S+)$", listing, flags=re.M)
        assert len(listed) == len(pool.tools(NAME)) and not any("verify" in n for n in listed)
        direct = agent_reply(
            episode, awm_agent.next_action('<tool_call>{"name": "verify", "arguments": {}}</tool_call>')
        )
        assert direct == awm_agent.unknown_tool_text("verify")
        _not_verified(episode)
        for name in ("verify", "mcp_tool_verify"):
            call = awm_agent.action_for_call(awm_agent.CALL_TOOL, {"tool_name": name, "arguments": "{}"})
            assert agent_reply(episode, call).startswith("Error: ")
            _not_verified(episode)
    finally:
        episode.close()


def test_the_online_awm_agent_environment_verifies_only_after_the_rollout(pool):
    env = awm_agent_environment_factory([pool.scenario(NAME)], pool=pool)()
    env.reset(scenario=NAME, task_idx=0)
    assert set(n for n in dir(type(env)) if not n.startswith("_")) >= {"list_tools", "call_tool"}
    assert not hasattr(type(env), "verify")
    assert env.call_tool(tool_name="verify", arguments="{}").startswith("Error: ")
    _not_verified(env._episode)
    # get_reward runs the verifier after the rollout: complete, but the format error keeps the reward at -1.0
    assert env.get_reward() == -1.0 and env._episode.verifier_reward == 1.0


@pytest.mark.parametrize("verify_turn", ["env_output", "omit"])
def test_the_capture_summary_counts_rollouts_that_only_called_verify(pool, verify_turn):
    from echo_trl.envs.awm.capture.summary import only_verified, summarize, summary_lines

    records = []
    for calls in ([], [("verify", {})], [("search_members", {"query": "Priya"})]):
        episode = pool.new_episode(NAME, 0)
        for name, arguments in calls:
            episode.call_tool(name, arguments)
        episode.verify()
        episode.close()
        records.append(episode.record(verify_turn))
    assert [only_verified(r) for r in records] == [True, False, False]  # a call named verify is a tool call
    summary = summarize(records)
    assert summary["verify_only"] == {"episodes": 1, "outcomes": {"complete": 1}}
    assert any(
        line.startswith("episodes that only called verify (no tool call): 1") for line in summary_lines(summary)
    )
