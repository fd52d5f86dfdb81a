"""The streaming build: the same rows, order, skipped records, errors and card as the in-memory build, in one
process or several.

Expectations are independent of the code under test: the in-memory sequential build
(:func:`build_awm_dataset`, the reference the streamed directory must equal row for row), the records
``load_awm_episodes`` rejects, and a card counted here by walking the rows as Python objects.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest
from helpers.episodes import openenv_episode, session_episode
from helpers.terminal import pretend_terminal

from echo_trl.commands.cli import main as cli
from echo_trl.data import build
from echo_trl.data.build import build_awm_dataset, write_awm_dataset
from echo_trl.data.card import CardCounts, dataset_card
from echo_trl.data.readers.records import load_awm_episodes
from echo_trl.errors import EpisodeError

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fixtures" / "bad_episodes"


@pytest.fixture
def many_files(tmp_path):
    """Bundled episodes split over several files, some holding invalid records among valid ones."""
    d = tmp_path / "in"
    d.mkdir()
    for k, src in enumerate(sorted((REPO / "data" / "episodes").glob("*.jsonl"))):
        shutil.copy(src, d / f"{k:02d}_{src.name}")
    (d / "03_mixed.jsonl").write_text(
        "\n".join([json.dumps(openenv_episode(task_idx=1)), "{not json", json.dumps(openenv_episode(task_idx=3))])
        + "\n"
    )
    (d / "07_session.json").write_text(json.dumps([session_episode(), {"steps": "nope"}]))
    return d


@pytest.fixture(params=[1, 3], ids=["one process", "three processes"])
def num_proc(request, monkeypatch):
    monkeypatch.setattr(build, "PARALLEL_MIN_BYTES", 0)  # the tiny inputs go parallel too
    return request.param


def expected_card_counts(rows) -> dict:
    """Messages and characters per role, walking the rows (the card's first implementation)."""
    counts = {r: {"messages": 0, "chars": 0} for r in ("context", "action", "env_output", "warning")}
    for row in rows:
        for m in row["prompt"]:
            counts["context"]["messages"] += 1
            counts["context"]["chars"] += len(m["content"] or "")
        for m, warns in zip(row["completion"], row["warnings"], strict=True):
            role = "action" if m["role"] == "assistant" else "env_output" if m["role"] == "tool" else "context"
            counts[role]["messages"] += 1
            counts[role]["chars"] += len(m["content"] or "") + sum(
                len(c["function"]["arguments"]) + len(c["function"]["name"]) for c in m["tool_calls"] or []
            )
            counts["warning"]["messages"] += len(warns)
            counts["warning"]["chars"] += sum(len(w) for w in warns)
    return counts


def test_streamed_directory_equals_the_in_memory_build(many_files, tmp_path, num_proc):
    skipped_ref = []
    reference = build_awm_dataset([many_files], strict=False, skipped=skipped_ref)
    out = tmp_path / "out"
    out.mkdir()
    result = write_awm_dataset([many_files], out, strict=False, num_proc=num_proc, skipped_file=out / "skipped.jsonl")
    assert len(list(out.glob("data-*.arrow"))) == num_proc  # one shard per process
    ds = datasets.load_from_disk(str(out))
    assert ds.features == reference.features and ds.to_list() == reference.to_list()  # same rows, same order
    lines = [json.loads(x) for x in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(x["source"], x["record"], x["reason"]) for x in lines] == [
        (s.source, s.record, s.reason) for s in skipped_ref
    ]
    assert result.skipped == len(skipped_ref) == 2 and result.reasons == [s.reason for s in skipped_ref]
    assert result.counts.rows == len(reference)
    assert result.counts.roles == expected_card_counts(reference)
    assert dataset_card(result.counts, skipped=2) == dataset_card(reference, skipped=2)


def test_a_strict_build_raises_the_first_bad_record_in_input_order(many_files, tmp_path, num_proc):
    (many_files / "09_late_bad.jsonl").write_text("{also not json\n")
    with pytest.raises(EpisodeError) as sequential:
        load_awm_episodes([many_files])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(EpisodeError) as streamed:
        write_awm_dataset([many_files], out, num_proc=num_proc)
    assert str(streamed.value) == str(sequential.value) and "03_mixed.jsonl:2" in str(streamed.value)


def test_nothing_valid_is_the_same_error(tmp_path, num_proc):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("duplicate_keys.json", "deeply_nested.json"):
        shutil.copy(CORPUS / name, bad / name)
    with pytest.raises(EpisodeError) as sequential:
        load_awm_episodes([bad], strict=False)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(EpisodeError) as streamed:
        write_awm_dataset([bad], out, strict=False, num_proc=num_proc)
    assert str(streamed.value) == str(sequential.value)


def test_card_counts_of_a_dataset_walk_no_rows_and_match_the_row_walk(many_files):
    ds = build_awm_dataset([many_files], strict=False)
    counts = CardCounts.of_dataset(ds.select([4, 0, 2]))
    assert counts.roles == expected_card_counts(ds.select([4, 0, 2]))
    halves = CardCounts.of_dataset(ds.select(range(3)))
    halves.merge(CardCounts.of_dataset(ds.select(range(3, len(ds)))))
    whole = CardCounts.of_dataset(ds)
    assert (halves.rows, halves.roles, halves.formats) == (whole.rows, whole.roles, whole.formats)
    assert {s: (e, g) for s, (e, g, _) in halves.scenarios.items()} == {
        s: (e, g) for s, (e, g, _) in whole.scenarios.items()
    }


def test_build_dataset_num_proc_flag(many_files, tmp_path, capsys):
    out = tmp_path / "ds"
    assert cli(["build-dataset", str(many_files), "--output", str(out), "--skip-invalid", "--num_proc", "2"]) == 0
    printed = capsys.readouterr()
    reference = build_awm_dataset([many_files], strict=False)
    assert f"built {len(reference)} episodes" in printed.out and "skipped 2 invalid record(s)" in printed.err
    assert datasets.load_from_disk(str(out)).to_list() == reference.to_list()
    assert (out / "README.md").read_text() == dataset_card(reference, skipped=2)
    assert not list(out.glob(".*"))  # no scratch left in the dataset directory
    with pytest.raises(SystemExit) as refused:
        cli(["build-dataset", str(many_files), "--output", str(out), "--num_proc", "0"])
    assert refused.value.code == 2


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_a_build_shows_the_input_read_with_an_eta_on_a_terminal_only(
    many_files, tmp_path, capsys, monkeypatch, num_proc, terminal
):
    pretend_terminal(monkeypatch, terminal)
    out = tmp_path / "out"
    out.mkdir()
    write_awm_dataset([many_files], out, strict=False, num_proc=num_proc)
    err = capsys.readouterr().err
    size = sum(f.stat().st_size for f in many_files.iterdir())
    if terminal:  # every input byte counted, whether one process read them or three
        assert "build-dataset (input read): 100%" in err and f"{size / 2**20:.2f}M/{size / 2**20:.2f}M" in err
    else:
        assert err == ""
