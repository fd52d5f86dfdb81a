"""docs/datasets.md's path from zero on AWM-1K-sized tool lists: episodes captured from the AWM-1K samples'
scenarios (a replay policy stands in for the inference server), built by the page's own build line, fit the
context training keeps; built without its ``--compact_tools``, the longest tool list does not, and training's
error names the row and scenario and the way out.

The expectation is independent of the build: each row's prompt rendered by the tiny model's tokenizer, against
that model's context length (``max_position_embeddings``), which is what ``echo-trl train`` keeps.
"""

from __future__ import annotations

import json
import shlex

import datasets
import pytest
from helpers.docs import blocks, logical_lines
from helpers.shared_data import AWM1K_SAMPLES, require_shared
from helpers.tiny import tiny_model, tiny_tokenizer

from echo_trl.commands.cli import main as cli
from echo_trl.tokens.tokenization import TruncationError, tokenize_with_roles
from echo_trl.train.offline.collator import CollatorSettings, trajectory_features

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]  # capture starts the scenarios' servers in bubblewrap


def _page_build_line() -> list[str]:
    """The build step's command of the page, as written."""
    (line,) = [
        line
        for block in blocks("docs/datasets.md")
        for line in logical_lines(block.code)
        if line.startswith("echo-trl build-dataset rollouts/")
    ]
    return shlex.split(line)


def test_the_pages_build_step_fits_awm1k_tool_lists_in_the_context(tmp_path, monkeypatch):
    samples = require_shared(AWM1K_SAMPLES)
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"task_idx": 0, "calls": [], "final_answer": "done"}) + "\n")
    monkeypatch.chdir(tmp_path)
    argv = ["capture", "--data", str(samples), "--all_scenarios", "--policy", f"replay:{replay}"]
    assert cli([*argv, "--episodes", "1", "--verify_turn", "omit", "--output", "rollouts/"]) == 0

    page = _page_build_line()
    assert "--compact_tools" in page
    assert cli(page[1:]) == 0
    without = [a for a in page[1:] if a != "--compact_tools"]
    without[without.index("rollouts_ds/")] = "full_ds/"
    assert cli(without) == 0

    tok, context = tiny_tokenizer("qwen3"), tiny_model().config.max_position_embeddings
    settings = CollatorSettings(max_length=context)
    built, full = datasets.load_from_disk("rollouts_ds"), datasets.load_from_disk("full_ds")
    assert sorted(built["scenario"]) == sorted(full["scenario"]) and len(built) >= 2
    assert all(tokenize_with_roles(tok, row).prompt_length < context for row in built)
    for row in built:
        trajectory_features(tok, row, settings)  # training keeps every row
    over = [row for row in full if tokenize_with_roles(tok, row).prompt_length > context]
    assert [row["scenario"] for row in over] == ["code_hosting_2"]  # 61 tools with their response documentation
    with pytest.raises(TruncationError) as exc:
        trajectory_features(tok, over[0], settings)
    assert "(scenario 'code_hosting_2'): the prompt alone has" in str(exc.value)
    assert "echo-trl build-dataset --compact_tools" in str(exc.value)
