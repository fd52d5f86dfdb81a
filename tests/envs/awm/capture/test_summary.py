"""capture's summary says when episodes teach little: empty, without a tool call, cut at the token limit."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

from echo_trl.envs.awm.capture.summary import summarize, summary_lines
from echo_trl.envs.awm.policies.model import ModelPolicy

BUNDLED = Path(__file__).resolve().parents[4] / "data" / "episodes" / "library_1_task0.jsonl"


def _verify_step(answer: str) -> dict:
    return {
        "action": {"tool_name": "verify", "arguments": {"verifier_mode": "code", "final_answer": answer}},
        "observation": {"reward_type": "incomplete", "done": True},
    }


def _records() -> list[dict]:
    """A bundled (useful) episode, and two a server answering "" at its token limit would leave."""
    useful = json.loads(BUNDLED.read_text(encoding="utf-8").splitlines()[0])
    tool_calls = sum(1 for s in useful["steps"] if s["action"]["tool_name"] != "verify")
    assert tool_calls > 0  # the expectation below counts it as a useful episode
    empty = {**copy.deepcopy(useful), "steps": [_verify_step("")]}
    empty["sampler"] = {"turns": [{"content": "", "finish_reason": "length", "usage": {"completion_tokens": 16}}]}
    chatty = {**copy.deepcopy(useful), "steps": [], "verification": _verify_step("I cannot help."), "sampler": None}
    chatty["sampler"] = {"turns": [{"content": "I cannot help.", "finish_reason": "stop"}]}
    return [useful, empty, chatty]


def test_empty_tool_less_and_cut_episodes_are_counted_and_warned_about():
    summary = summarize(_records())
    assert summary["quality"] == {
        "empty": 1,
        "without_tool_call": 2,
        "episodes_at_token_limit": 1,
        "turns_at_token_limit": 1,
    }
    lines = summary_lines(summary)
    (warning,) = [line for line in lines if line.startswith("WARNING")]
    assert "1 of 3 episodes are empty" in warning and "2 of 3 episodes have no tool call" in warning
    assert "1 of 3 episodes have a reply cut at the token limit" in warning and "--max_new_tokens" in warning


def test_a_collection_of_useful_episodes_has_no_warning():
    useful = _records()[0]
    summary = summarize([useful, useful])
    assert summary["quality"]["empty"] == summary["quality"]["without_tool_call"] == 0
    assert not [line for line in summary_lines(summary) if "WARNING" in line]


def test_a_model_turn_that_fills_max_new_tokens_without_ending_is_cut_at_the_limit():
    eos = 7
    policy = SimpleNamespace(
        model=SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[eos, 8])),
        tokenizer=SimpleNamespace(eos_token_id=eos),
        max_new_tokens=3,
    )
    reason = lambda ids: ModelPolicy.finish_reason(policy, ids)  # noqa: E731
    assert reason([1, 2, 3]) == "length"
    assert reason([1, 2, eos]) == "stop" and reason([1, 8]) == "stop" and reason([1, 2]) == "stop"
