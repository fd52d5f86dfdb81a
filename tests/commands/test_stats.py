"""`echo-trl stats`: token accounting per role, and what a --max_length cut would remove, row by row."""

from __future__ import annotations

import json

import pytest
from helpers.episodes import openenv_episode
from helpers.terminal import pretend_terminal
from helpers.tiny import tiny_tokenizer

from echo_trl.commands.cli import main as cli_main
from echo_trl.commands.stats import truncation_report
from echo_trl.data.build import trajectories_to_dataset
from echo_trl.data.readers.records import awm_episode_to_trajectory
from echo_trl.tokens.tokenization import tokenize_with_roles


def _dataset():
    short = awm_episode_to_trajectory(openenv_episode(task_idx=0))
    long_prompt = awm_episode_to_trajectory(openenv_episode(task="Add a notebook to my cart. " * 40, task_idx=1))
    return trajectories_to_dataset([short, long_prompt, short])


def test_report_names_what_each_row_would_lose_and_rows_whose_prompt_alone_is_too_long():
    tok = tiny_tokenizer("qwen3")
    ds = _dataset()
    short, long_prompt = tokenize_with_roles(tok, ds[0]), tokenize_with_roles(tok, ds[1])
    # a limit between the short row's 2nd message end and its full length, below the long row's prompt
    limit = short.message_token_spans[1][1] + 1
    assert long_prompt.prompt_length > limit and len(short) > limit
    report = truncation_report(tok, ds, limit)
    assert report["prompt_exceeds_episodes"] == 1 and report["truncated_episodes"] == 2
    (too_long,) = [r for r in report["rows"] if r.get("prompt_exceeds")]
    assert too_long == {
        "row": 1,
        "group_id": ds[1]["group_id"],
        "tokens": len(long_prompt),
        "prompt_tokens": long_prompt.prompt_length,
        "prompt_exceeds": True,
    }
    cut = [r for r in report["rows"] if not r.get("prompt_exceeds")]
    assert [r["row"] for r in cut] == [0, 2]
    # the cut keeps the first two messages (the third ends past the limit): the rest is what is lost
    kept = short.message_token_spans[1][1]
    kept_roles = {"env_output": sum(short.env_output_mask[:kept]), "action": sum(short.action_mask[:kept])}
    for r in cut:
        assert r["cut_tokens"] == len(short) - kept and r["cut_messages"] == len(short.message_token_spans) - 2
        assert r["cut_by_role"]["env_output"] == sum(short.env_output_mask) - kept_roles["env_output"]
        assert r["cut_by_role"]["action"] == sum(short.action_mask) - kept_roles["action"]
        assert sum(r["cut_by_role"].values()) == r["cut_tokens"]
    assert report["truncated_tokens"] == 2 * (len(short) - kept)


def test_cli_reports_instead_of_aborting(tmp_path, capsys):
    tok = tiny_tokenizer("qwen3")
    tok.save_pretrained(tmp_path / "tok")
    ds = _dataset()
    ds.save_to_disk(str(tmp_path / "ds"))
    limit = tokenize_with_roles(tok, ds[0]).message_token_spans[1][1] + 1
    argv = ["stats", str(tmp_path / "ds"), "--tokenizer", str(tmp_path / "tok"), "--max_length", str(limit)]
    assert cli_main(argv) == 0  # was: "row 1: the prompt alone has N tokens", exit 2
    text = capsys.readouterr().out
    assert f"cut at max_length={limit}: 2 of 3 episodes would lose" in text
    assert f"1 episode has a prompt longer than {limit} tokens" in text and "the prompt alone has" in text
    assert cli_main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 3 and result["truncated_episodes"] == 2 and result["max_length"] == limit
    assert result["truncation"]["prompt_exceeds_episodes"] == 1
    # the per-role counts stay those of the whole trajectories
    assert result["total_tokens"] == sum(len(tokenize_with_roles(tok, row)) for row in ds)


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_the_token_cache_build_shows_a_bar_with_an_eta_on_a_terminal_only(tmp_path, capsys, monkeypatch, terminal):
    tiny_tokenizer("qwen3").save_pretrained(tmp_path / "tok")
    _dataset().save_to_disk(str(tmp_path / "ds"))
    pretend_terminal(monkeypatch, terminal)  # the command turns datasets' bars off for short work: this is long work
    assert cli_main(["stats", str(tmp_path / "ds"), "--tokenizer", str(tmp_path / "tok")]) == 0
    err = capsys.readouterr().err
    assert ("tokenizing trajectories" in err and "100%" in err and "3/3" in err) is terminal
    assert cli_main(["stats", str(tmp_path / "ds"), "--tokenizer", str(tmp_path / "tok")]) == 0
    assert "tokenizing" not in capsys.readouterr().err  # read from the cache: nothing long, no bar
