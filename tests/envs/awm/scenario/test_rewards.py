"""The reward rules against what the upstream OpenEnv AWM server answered (tests/fixtures/upstream_awm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_trl.envs.awm.scenario.rewards import (
    RewardConfig,
    classify_tool_error,
    episode_outcome,
    step_reward,
    verify_observation,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "upstream_awm"


def _recorded_replies() -> list[dict]:
    out = []
    for line in (FIXTURES / "recordings.jsonl").read_text(encoding="utf-8").splitlines():
        out += [ex["reply"]["data"] for ex in json.loads(line)["exchanges"] if isinstance(ex["reply"], dict)]
    return out


REPLIES = [r for r in _recorded_replies() if "observation" in r]
TOOL_ERRORS = {
    r["observation"]["error"]: r["observation"]["reward_type"]
    for r in REPLIES
    if r["observation"].get("tool_name") and "error" in r["observation"]
}


def test_the_recordings_hold_every_tool_error_kind():
    assert set(TOOL_ERRORS.values()) == {"tool_not_found", "invalid_args", "server_error"}
    assert TOOL_ERRORS['Error calling get_member. Status code: 404. Response: {"detail":"Member 9999 not found"}'] == (
        "tool_not_found"  # a 404 of an existing tool: a format error upstream
    )


@pytest.mark.parametrize("text", sorted(TOOL_ERRORS))
def test_tool_errors_are_classified_as_the_server_classified_them(text):
    assert classify_tool_error(text) == TOOL_ERRORS[text]


@pytest.mark.parametrize(
    "text, reward_type",
    [
        ("Tool call timed out after 30.0s", "timeout"),
        ("request TIMEOUT", "timeout"),
        ("Error calling x. Status code: 409. Response: copy is on loan", "server_error"),
        ("missing field; also not found", "tool_not_found"),  # the first rule that matches wins
        ("No tool named x", "tool_not_found"),
        ("bad schema", "invalid_args"),
        ("", "server_error"),
    ],
)
def test_the_keyword_rule_and_its_order(text, reward_type):
    assert classify_tool_error(text) == reward_type


def test_step_rewards_are_the_servers():
    rewards = RewardConfig()
    seen = {(r["observation"]["reward_type"], r["reward"]) for r in REPLIES if r["reward"] is not None}
    seen.discard(("episode_done", 0.0))  # the 'done' tool: not a step echo_trl records
    assert {rt for rt, _ in seen} >= {"tool_call_ok", "tool_not_found", "invalid_args", "server_error", "complete"}
    for reward_type, reward in seen:
        assert step_reward(reward_type, rewards) == reward, reward_type
    assert step_reward("invalid_action", rewards) == -1.0 and step_reward("incomplete", rewards) == 0.1
    assert step_reward("timeout", RewardConfig(other=0.5)) == 0.5


def test_episode_outcome_keeps_a_format_error():
    r = RewardConfig()
    assert episode_outcome("complete", 1.0, 0, r) == ("complete", 1.0)
    assert episode_outcome("complete", 1.0, 2, r) == ("format_error", -1.0)
    assert episode_outcome("stopped", 0.0, 1, r) == ("format_error", -1.0)
    assert episode_outcome("tool_not_found", -1.0, 1, r) == ("tool_not_found", -1.0)
    assert episode_outcome("stopped", 0.0, 0, r) == ("stopped", 0.0)


def test_a_verifier_failure_has_the_servers_three_keys():
    obs, details = verify_observation(
        "judge_error",
        {
            "verifier_mode": "code",
            "verifier": "gen_verifier.pure_code.jsonl:3",
            "result": "others",
            "execution_status": "timeout",
            "error_message": "verifier did not finish within 2s (killed)",
        },
        scenario="s",
        task="t",
        task_idx=3,
        steps_taken=4,
        verifier_mode="code",
    )
    assert obs == {
        "reward_type": "judge_error",
        "scenario": "s",
        "task": "t",
        "task_idx": 3,
        "verify_result": {
            "result": "others",
            "execution_status": "error",
            "error_message": "verifier did not finish within 2s (killed)",
        },
        "steps_taken": 4,
    }
    assert details == {
        "verifier_mode": "code",
        "verifier": "gen_verifier.pure_code.jsonl:3",
        "execution_status": "timeout",
    }
