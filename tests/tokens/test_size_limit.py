"""A trajectory longer than ``max_rendered_chars`` is refused in one line before the tokenizer sees it.

Tested with a small bound (the real inputs, a 50 MB tool output or 100k steps, are measured in
docs/reliability.md): the refusal names the row, the rendered size, the limit and the flag.
"""

from __future__ import annotations

import pytest
from helpers.episodes import openenv_episode
from helpers.tiny import tiny_tokenizer

from echo_trl.commands.cli import main as cli_main
from echo_trl.data.build import trajectories_to_dataset
from echo_trl.data.readers.records import awm_episode_to_trajectory
from echo_trl.tokens.size_limit import (
    DEFAULT_MAX_RENDERED_CHARS,
    RenderedSizeError,
    content_chars,
    max_rendered_chars,
    set_max_rendered_chars,
)
from echo_trl.tokens.template import layout as layout_module
from echo_trl.tokens.tokenization import tokenize_with_roles


@pytest.fixture
def tok():
    """The shared tiny tokenizer, its bound restored afterwards (other tests tokenize with it)."""
    tokenizer = tiny_tokenizer("qwen3")
    yield tokenizer
    set_max_rendered_chars(tokenizer, DEFAULT_MAX_RENDERED_CHARS)


def _big(n_chars: int, task_idx: int = 1):
    episode = openenv_episode(task_idx=task_idx)
    episode["steps"][0]["observation"]["tool_result"] = "x" * n_chars
    return awm_episode_to_trajectory(episode)


def test_the_bound_is_the_rendered_length(tok):
    trajectory = _big(3_000)
    rendered = len(tokenize_with_roles(tok, trajectory).text)  # unbounded (the default is far above)
    assert content_chars(trajectory) < rendered  # the content is a lower bound of the rendered text
    set_max_rendered_chars(tok, rendered)
    assert len(tokenize_with_roles(tok, trajectory).text) == rendered  # at the limit: kept
    set_max_rendered_chars(tok, rendered - 1)
    with pytest.raises(RenderedSizeError) as info:
        tokenize_with_roles(tok, trajectory)
    message = str(info.value)
    assert f"rendered text is {rendered:,} characters" in message
    assert f"limit of {rendered - 1:,}" in message and "--max_rendered_chars" in message


def test_content_over_the_bound_is_refused_before_rendering(tok, monkeypatch):
    trajectory = _big(50_000)
    renders = []
    monkeypatch.setattr(layout_module, "render", lambda *a, **k: renders.append(1) or "")
    set_max_rendered_chars(tok, 10_000)
    with pytest.raises(RenderedSizeError, match=f"at least {content_chars(trajectory):,} characters"):
        tokenize_with_roles(tok, trajectory)
    assert renders == []  # the chat template never ran
    assert content_chars(trajectory) >= 50_000


def test_none_means_no_bound_and_bad_bounds_are_refused(tok):
    set_max_rendered_chars(tok, None)
    assert max_rendered_chars(tok) is None
    assert tokenize_with_roles(tok, _big(3_000)).text
    for bad in (0, -1, 2.5, True):
        with pytest.raises(Exception, match="--max_rendered_chars"):
            set_max_rendered_chars(tok, bad)
    assert max_rendered_chars(tiny_tokenizer("llama3_1")) == DEFAULT_MAX_RENDERED_CHARS  # per tokenizer


def test_stats_names_the_row_size_limit_and_flag(tok, tmp_path, capsys):
    small = awm_episode_to_trajectory(openenv_episode(task_idx=0))
    trajectories_to_dataset([small, _big(20_000), small]).save_to_disk(str(tmp_path / "ds"))
    tok.save_pretrained(tmp_path / "tok")
    argv = ["stats", str(tmp_path / "ds"), "--tokenizer", str(tmp_path / "tok")]
    assert cli_main([*argv, "--json"]) == 0  # the default bound is far above
    capsys.readouterr()
    assert cli_main([*argv, "--max_rendered_chars", "10000"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("echo-trl stats: error: row 1 (group_id ")
    assert "rendered text is at least 20," in line and "limit of 10,000" in line and "--max_rendered_chars" in line


def test_training_refuses_the_row_at_trainer_init(tok, tmp_path):
    from helpers.trainer import make_trainer

    small = [awm_episode_to_trajectory(openenv_episode(task_idx=i)) for i in (0, 0, 2)]
    ds = trajectories_to_dataset([*small, _big(20_000, task_idx=2)])
    with pytest.raises(RenderedSizeError, match=r"row 3 \(group_id .*limit of 10,000.*--max_rendered_chars"):
        make_trainer(tmp_path, ds, max_rendered_chars=10_000)
    with pytest.raises(ValueError, match="max_rendered_chars must be a positive number"):
        make_trainer(tmp_path, ds, max_rendered_chars=0)


def test_eval_world_model_names_the_row(tok, tmp_path, capsys):
    from echo_trl.demo.tiny import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "model", family="qwen3", vocab_size=600, hidden_size=32)
    small = awm_episode_to_trajectory(openenv_episode(task_idx=0))
    trajectories_to_dataset([small, _big(20_000)]).save_to_disk(str(tmp_path / "ds"))
    argv = ["eval-world-model", "--model", str(model), "--dataset", str(tmp_path / "ds")]
    capsys.readouterr()  # the builders' progress bars
    assert cli_main([*argv, "--max_rendered_chars", "10000"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("echo-trl eval-world-model: error: row 1 (group_id ")
    assert "limit of 10,000" in line and "--max_rendered_chars" in line
