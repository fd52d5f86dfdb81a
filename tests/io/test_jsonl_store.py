"""The resumable JSONL store against damaged or hostile output directories (issue 32).

Only strict JSON is ever written; a full disk leaves no torn line; ``repair`` never follows a link, opens only
regular files and keeps (and reports) a complete last record that lacks its newline; the state file is read
bounded and type-checked. Each a one-line ``StoreError``.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from echo_trl.io import jsonl_store
from echo_trl.io.jsonl_store import JsonlStore, StoreError


def store(path) -> JsonlStore:
    return JsonlStore(path, pattern="*.jsonl", lock_file=".lock", state_file="state.json")


@pytest.mark.parametrize(
    ("record", "needle"),
    [({"x": float("nan")}, "x"), ({"a": [1.0, float("inf")]}, "a[1]"), ({"t": "\ud800"}, "surrogate")],
)
def test_a_record_that_is_not_strict_json_is_refused_and_nothing_is_written(tmp_path, record, needle):
    s = store(tmp_path)
    with pytest.raises(StoreError, match="not strict JSON") as err:
        s.append("f.jsonl", record)
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "f.jsonl").exists() or (tmp_path / "f.jsonl").read_bytes() == b""
    s.append("f.jsonl", {"ok": 1.5})
    assert json.loads((tmp_path / "f.jsonl").read_text()) == {"ok": 1.5}


def test_a_full_disk_mid_write_leaves_no_torn_line(tmp_path, monkeypatch):
    s = store(tmp_path)
    s.append("f.jsonl", {"first": 1})
    before = (tmp_path / "f.jsonl").read_bytes()
    real_write, calls = os.write, []

    def write_then_fill(fd, data):  # the first chunk lands, then the disk is full
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:7]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(jsonl_store.os, "write", write_then_fill)
    with pytest.raises(StoreError, match="No space left on device") as err:
        s.append("f.jsonl", {"second": "x" * 100})
    assert "rerun the same command" in str(err.value) and len(calls) == 2
    monkeypatch.undo()
    assert (tmp_path / "f.jsonl").read_bytes() == before and s.written == 1


def test_a_complete_last_record_without_its_newline_is_kept_and_reported(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text('{"n": 1}\n{"n": 2}')
    s = store(tmp_path)
    s.acquire()
    s.release()
    assert f.read_text() == '{"n": 1}\n{"n": 2}\n'
    assert s.repaired == ["a.jsonl: added the newline its complete last record lacked"]


def test_a_torn_last_line_is_cut_and_reported(tmp_path):
    f = tmp_path / "a.jsonl"
    torn = '{"n": 2, "te'
    f.write_text('{"n": 1}\n' + torn)
    s = store(tmp_path)
    s.acquire()
    s.release()
    cut = f"a.jsonl: cut {len(torn)} bytes of an episode left half-written"
    assert f.read_text() == '{"n": 1}\n' and s.repaired == [cut]


def test_repair_never_follows_a_link_out_of_the_output(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious, no newline at the end")
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.jsonl").symlink_to(outside)
    with pytest.raises(StoreError, match="symbolic link") as err:
        store(out).acquire()
    assert "x.jsonl" in str(err.value)
    assert outside.read_text() == "precious, no newline at the end"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_repair_refuses_what_is_not_a_regular_file_without_blocking(tmp_path, kind):
    path = tmp_path / "x.jsonl"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    s = store(tmp_path)
    with pytest.raises(StoreError, match="x.jsonl") as err:
        s.acquire()
    assert "\n" not in str(err.value)
    s.release()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("fifo", "not a regular file"),
        ("/dev/zero", "not a regular file"),
        ("big", "more than the"),
        ('{"settings": [1, 2]}', 'expected {"settings"'),
        ("[]", 'expected {"settings"'),
        ('{"settings": {"t": NaN}}', "NaN"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_the_state_file_is_read_bounded_and_type_checked(tmp_path, content, needle):
    path = tmp_path / "state.json"
    if content == "fifo":
        os.mkfifo(path)
    elif content == "/dev/zero":
        path.symlink_to("/dev/zero")
        needle = "link"  # never followed at all
    elif content == "big":
        with open(path, "wb") as fh:
            fh.truncate(jsonl_store.STATE_MAX_BYTES + 1)
    else:
        path.write_text(content)
    with pytest.raises(StoreError, match="unreadable") as err:
        store(tmp_path).check_settings({"t": 1.0})
    assert needle in str(err.value) and "\n" not in str(err.value), err.value
