"""The file layer: which inputs are episode files, and every part that cannot be read is named."""

from __future__ import annotations

import json

import pytest
from helpers.episodes import openenv_episode

from echo_trl.data.readers.episode_files import find_episode_files
from echo_trl.data.readers.records import load_awm_episodes
from echo_trl.errors import EpisodeError


def test_suffixes_in_any_case_are_episode_files(tmp_path):
    (tmp_path / "A.JSON").write_text(json.dumps(openenv_episode(task_idx=0)))
    (tmp_path / "b.JsonL").write_text(
        json.dumps(openenv_episode(task_idx=1)) + "\n" + json.dumps(openenv_episode(task_idx=2))
    )
    (tmp_path / "notes.txt").write_text("not an episode")
    kept, skipped = load_awm_episodes([tmp_path])
    assert [t.task_idx for t in kept] == [0, 1, 2] and skipped == []  # b.JsonL read line by line


def test_input_that_yields_nothing_is_an_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "README.md").write_text("no episodes here")
    for inputs in ([empty], [tmp_path / "other"]):
        for strict in (True, False):
            with pytest.raises(EpisodeError, match=r"no episode files \(\.json, \.jsonl\) in this directory"):
                load_awm_episodes(inputs, strict=strict)
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text('{"scenario": 1}\n')
    with pytest.raises(
        EpisodeError, match=r"no valid episodes \(all 1 record\(s\) are invalid; first: .*bad.jsonl:1: "
    ):
        load_awm_episodes([only_bad], strict=False)
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    with pytest.raises(EpisodeError, match="no valid episodes .no episode records"):
        load_awm_episodes([blank])


def test_empty_directory_beside_valid_input_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(openenv_episode()))
    with pytest.raises(EpisodeError, match=r"empty: no episode files"):
        load_awm_episodes([good, tmp_path / "empty"])
    kept, skipped = load_awm_episodes([good, tmp_path / "empty"], strict=False)
    assert len(kept) == 1 and [(s.source, s.reason) for s in skipped] == [
        (str(tmp_path / "empty"), f"{tmp_path / 'empty'}: no episode files (.json, .jsonl) in this directory")
    ]


def test_dangling_link_and_unlistable_directory_are_named(tmp_path, monkeypatch):
    (tmp_path / "good.json").write_text(json.dumps(openenv_episode()))
    (tmp_path / "gone.json").symlink_to(tmp_path / "nowhere.json")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "hidden.json").write_text(json.dumps(openenv_episode(task_idx=5)))
    real_scandir = __import__("os").scandir

    def scandir(path="."):  # what listing a mode-000 directory does as a non-root user
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr("os.scandir", scandir)
    with pytest.raises(EpisodeError, match=r"gone.json: not a regular file"):
        load_awm_episodes([tmp_path])
    with pytest.raises(EpisodeError, match=r"locked: cannot read directory: Permission denied"):
        load_awm_episodes([tmp_path / "good.json", tmp_path / "locked"])
    kept, skipped = load_awm_episodes([tmp_path], strict=False)
    assert [t.task_idx for t in kept] == [2]
    assert sorted(s.reason for s in skipped) == [
        f"{tmp_path / 'gone.json'}: not a regular file (a dangling link?)",
        f"{tmp_path / 'locked'}: cannot read directory: Permission denied",
    ]


def test_find_episode_files_raises_or_collects_problems(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EpisodeError, match="empty: no episode files"):
        find_episode_files([tmp_path / "a.json", tmp_path / "empty"])
    problems = []
    assert find_episode_files([tmp_path / "a.json", tmp_path / "empty", tmp_path / "a.json"], problems) == [
        tmp_path / "a.json"
    ]
    assert [p.source for p in problems] == [str(tmp_path / "empty")]
