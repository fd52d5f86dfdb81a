"""Rollout-quality statistics the world-term filters read."""

from __future__ import annotations

from helpers.episodes import traj

from echo_trl.tokens.quality import is_error_output, rollout_quality


def test_rollout_quality():
    t = traj(
        outputs=("ok", "Error: boom", '{"error": "bad id"}', "{'error': 'Tool x not found.'}"),
        tools=("search", "add", "nope", "add"),
    )
    t.tools = t.tools[:2]  # "nope" is not offered
    t.warnings[3] = ["format warning"]
    q = rollout_quality(t.completion, t.tools, t.warnings)
    assert q == {"valid_tool_call_pct": 75.0, "parse_clean_pct": 75.0, "correct_pct": 25.0}
    assert rollout_quality([], []) == {"valid_tool_call_pct": 100.0, "parse_clean_pct": 100.0, "correct_pct": 100.0}
    assert not is_error_output('{"error": null, "items": []}') and is_error_output("error: x")
