"""The one atomic writer and the resumable JSONL store: whole or nothing, no temporary left, one writer."""

from __future__ import annotations

import json
import os
import stat

import pytest

from echo_trl.io import atomic
from echo_trl.io.atomic import move_dir_into_place, replace_dir, staging_dir, write_file
from echo_trl.io.jsonl_store import JsonlStore, StoreError


def test_write_file_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("old")
    write_file(path, "new ünïcode")
    write_file(tmp_path / "image.db", b"\x00\x01", durable=False, mode=0o600)
    assert path.read_text(encoding="utf-8") == "new ünïcode"
    assert (tmp_path / "image.db").read_bytes() == b"\x00\x01"
    assert stat.S_IMODE((tmp_path / "image.db").stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.db", "state.json"]


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    path.write_text("old")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        write_file(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_write_file_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / ".out.deadbeef.tmp")
    monkeypatch.setattr(atomic.secrets, "token_hex", lambda n: "deadbeef")  # the temporary's name is the link's
    with pytest.raises(FileExistsError):
        write_file(tmp_path / "out", "x")
    assert victim.read_text() == "keep" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("exchange", [True, False])
def test_replace_dir_swaps_in_the_new_directory_and_hands_back_the_old(tmp_path, monkeypatch, exchange):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    with staging_dir(out) as new:
        (new / "new.txt").write_text("new")
        previous = replace_dir(new, out)
        assert previous is not None and (previous / "old.txt").read_text() == "old"
        assert [p.name for p in out.iterdir()] == ["new.txt"]
        if previous != new:
            assert previous.name.startswith(".out.old-")
            previous.rename(tmp_path / "removed")  # what the caller does with a parked copy
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] + (["removed"] if not exchange else [])


def test_move_dir_into_place_keeps_a_finished_directory_and_replaces_an_unfinished_one(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "weights").write_text("someone else's")
    finished = lambda p: (p / "done.json").exists()  # noqa: E731
    with staging_dir(path) as mine:
        (mine / "weights").write_text("mine")
        (mine / "done.json").write_text("{}")
        assert move_dir_into_place(mine, path, finished)
    assert (path / "weights").read_text() == "mine"  # the unfinished one was replaced
    with staging_dir(path) as late:
        (late / "weights").write_text("late")
        assert move_dir_into_place(late, path, finished)
    assert (path / "weights").read_text() == "mine"  # the finished one won
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def _store(out):
    return JsonlStore(out, pattern="*.jsonl", lock_file=".lock", state_file="state.json", writer="test")


def test_store_appends_whole_lines_cuts_a_torn_one_and_keeps_one_writer(tmp_path):
    store = _store(tmp_path)
    store.acquire()
    try:
        store.append("a.jsonl", {"n": 1})
        store.append("a.jsonl", {"n": 2})
        with pytest.raises(StoreError, match=r"another test holds \.lock there"):
            _store(tmp_path).acquire()
    finally:
        store.release()
    with open(tmp_path / "a.jsonl", "ab") as fh:
        fh.write(b'{"n": 3, "half')  # a writer killed inside its write
    again = _store(tmp_path)
    again.acquire()
    again.release()
    assert again.repaired == ["a.jsonl: cut 14 bytes of an episode left half-written"]
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"n": 1}, {"n": 2}]


def test_store_refuses_a_rerun_with_other_settings(tmp_path):
    _store(tmp_path).check_settings({"seed": 0, "model": "m"})
    _store(tmp_path).check_settings({"seed": 0, "model": "m"})
    with pytest.raises(StoreError, match=r"collected with seed=0, this run asks 1 \(1 setting\(s\) differ: seed\)"):
        _store(tmp_path).check_settings({"seed": 1, "model": "m"})
