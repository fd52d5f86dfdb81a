"""Content keys of saved datasets: a file is hashed once per version, and any edit gives a new key."""

from __future__ import annotations

import hashlib
import os
import time

import datasets
import pytest
from helpers.arrow_edit import arrow_files, redact_in_place

from echo_trl.data import content


@pytest.fixture
def reads(monkeypatch, tmp_path):
    """Every full read of a file for hashing, by path; the digest records under a private cache home."""
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(content, "RACY_SECONDS", 0.0)
    seen: list[str] = []
    real = content.hash_file

    def counting(path):
        seen.append(path)
        return real(path)

    monkeypatch.setattr(content, "hash_file", counting)
    return seen


def _saved(tmp_path) -> datasets.Dataset:
    ds = datasets.Dataset.from_dict({"text": ["alpha beta", "gamma delta"], "n": [1, 2]})
    ds.save_to_disk(str(tmp_path / "ds"))
    return datasets.load_from_disk(str(tmp_path / "ds"))


def test_the_digest_is_the_sha256_of_the_bytes_and_is_read_once(tmp_path, reads):
    f = tmp_path / "a.bin"
    f.write_bytes(b"some arrow bytes")
    expected = hashlib.sha256(b"some arrow bytes").hexdigest()
    assert content.file_digest(f) == expected
    assert content.file_digest(f) == expected
    assert len(reads) == 1  # the second call trusted the remembered digest


def test_an_edit_that_keeps_size_and_mtime_is_still_seen(tmp_path, reads):
    """``touch`` can set the mtime back; the ctime (and the record's whole stat key) still moves."""
    f = tmp_path / "a.bin"
    f.write_bytes(b"aaaa")
    first = content.file_digest(f)
    st = os.stat(f)
    time.sleep(0.01)
    with open(f, "r+b") as fh:
        fh.write(b"bbbb")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(f).st_size, os.stat(f).st_mtime_ns, os.stat(f).st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert content.file_digest(f) == hashlib.sha256(b"bbbb").hexdigest() != first


def test_a_file_written_within_the_racy_window_is_not_remembered(tmp_path, reads, monkeypatch):
    monkeypatch.setattr(content, "RACY_SECONDS", 3600.0)
    f = tmp_path / "a.bin"
    f.write_bytes(b"fresh")
    content.file_digest(f)
    content.file_digest(f)
    assert len(reads) == 2


def test_dataset_key_follows_the_arrow_data_not_state_json(tmp_path, reads):
    ds = _saved(tmp_path)
    key = content.dataset_content_key(ds)
    assert content.dataset_content_key(datasets.load_from_disk(str(tmp_path / "ds"))) == key
    redact_in_place(tmp_path / "ds", "alpha", "ALPHA")  # same length, mtime set back
    edited = datasets.load_from_disk(str(tmp_path / "ds"))
    assert edited._fingerprint == ds._fingerprint
    assert content.dataset_content_key(edited) != key
    # Transforms still count: another view of the same files is another key.
    assert content.dataset_content_key(edited.select([1])) != content.dataset_content_key(edited)


def test_files_of_a_content_addressed_cache_are_named_by_path_not_read(tmp_path, reads):
    ds = _saved(tmp_path)
    files = [os.path.realpath(f["filename"]) for f in ds.cache_files]
    key = content.dataset_content_key(ds, content_addressed=tmp_path)
    assert not set(files) & set(reads)  # nothing under the cache read
    assert key == content.dataset_content_key(ds, content_addressed=tmp_path / ".." / tmp_path.name)
    assert key != content.dataset_content_key(ds)  # elsewhere: hashed, another key
    assert set(files) <= set(reads)
    (tmp_path / "ds").rename(tmp_path / "other")  # another content key is another directory: another key
    moved = datasets.load_from_disk(str(tmp_path / "other"))
    assert content.dataset_content_key(moved, content_addressed=tmp_path) != key


def test_refingerprinted_dataset_keeps_rows_format_and_files(tmp_path, reads):
    ds = _saved(tmp_path).with_format("numpy", columns=["n"])
    keyed = content.with_content_fingerprint(ds)
    assert keyed._fingerprint != ds._fingerprint
    assert content.with_content_fingerprint(ds)._fingerprint == keyed._fingerprint  # a key, not a random one
    assert keyed.format == ds.format and keyed[:]["n"].tolist() == [1, 2]
    assert [f["filename"] for f in keyed.cache_files] == [str(p) for p in arrow_files(tmp_path / "ds")]


def test_an_unwritable_cache_home_only_costs_a_reread(tmp_path, reads, monkeypatch):
    (tmp_path / "file-not-dir").write_text("x")
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path / "file-not-dir"))
    f = tmp_path / "a.bin"
    f.write_bytes(b"abc")
    assert content.file_digest(f) == content.file_digest(f) == hashlib.sha256(b"abc").hexdigest()
    assert len(reads) == 2
