"""AWM scenario data: local directory, Hub cache (offline), validation errors, database build/restore."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from echo_trl.envs.awm.scenario.database import build_database, copy_database
from echo_trl.envs.awm.scenario.source import FILES, HUB_REPO_ID, ScenarioError, ScenarioSource, verifier_function

SAMPLES = Path(__file__).resolve().parents[5] / "shared" / "data" / "awm1k_samples"


@pytest.fixture(scope="module")
def samples() -> Path:
    if not SAMPLES.is_dir():
        pytest.skip(f"shared AWM-1K samples not found at {SAMPLES} (they live in ../shared/data, not in the repo)")
    return SAMPLES


def test_local_dir_loads_partial_scenarios(samples):
    src = ScenarioSource.from_dir(samples)
    assert src.list_scenarios() == ["e_commerce_33", "content_platform_1", "code_hosting_2"]
    cp = src.load("content_platform_1")
    assert len(cp.tasks) == 10 and cp.env_code and cp.db_schema and cp.sample_data and not cp.verifiers
    ec = src.load("e_commerce_33")
    assert ec.env_code is None and sorted(ec.verifiers) == [
        (0, "code"),
        (0, "sql"),
        (1, "code"),
        (1, "sql"),
        (2, "code"),
        (2, "sql"),
    ]
    assert ec.verifier(0, "code").function == "verify_task_completion"
    assert ec.verifier(2, "sql").function == "verify_task"
    with pytest.raises(ScenarioError, match=r"scenario 'e_commerce_33'.*env_code.*gen_envs.jsonl"):
        ec.require("env_code")
    with pytest.raises(ScenarioError, match="task_idx 10 out of range"):
        cp.task(10)
    with pytest.raises(ScenarioError, match="'nope'.*not found"):
        src.load("nope")


def _bad_dir(tmp_path: Path, samples: Path, mutate) -> Path:
    d = tmp_path / "bad"
    d.mkdir()
    for f in ("gen_tasks.jsonl", "gen_db.jsonl", "gen_sample.jsonl"):
        lines = [json.loads(line) for line in (samples / f).read_text().splitlines()]
        mutate(f, lines)
        (d / f).write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return d


@pytest.mark.parametrize(
    "file,edit,pattern",
    [
        (
            "gen_db.jsonl",
            lambda r: r["db_schema"]["tables"][3].__setitem__("ddl", 7),
            r"scenario 'content_platform_1': gen_db.jsonl:2: db_schema.tables\[3\].ddl: expected str, got int",
        ),
        ("gen_db.jsonl", lambda r: r.pop("db_schema"), r"gen_db.jsonl:2: db_schema: missing"),
        (
            "gen_sample.jsonl",
            lambda r: r["sample_data"]["tables"][0]["insert_statements"].append(None),
            r"sample_data.tables\[0\].insert_statements\[\d+\]: expected a SQL string",
        ),
        (
            "gen_tasks.jsonl",
            lambda r: r["tasks"].__setitem__(4, ""),
            r"gen_tasks.jsonl:2: tasks\[4\]: expected a non-empty",
        ),
    ],
)
def test_bad_scenario_data_names_scenario_file_and_field(tmp_path, samples, file, edit, pattern):
    def mutate(f, lines):
        if f == file:
            edit(next(x for x in lines if x["scenario"] == "content_platform_1"))

    src = ScenarioSource.from_dir(_bad_dir(tmp_path, samples, mutate))
    with pytest.raises(ScenarioError, match=pattern):
        src.load("content_platform_1")


def test_database_build_snapshot_and_restore(tmp_path, samples):
    sc = ScenarioSource.from_dir(samples).load("e_commerce_33")
    report = build_database(sc, tmp_path / "live.db")
    assert report.tables == 19 and report.inserts == 133 and report.failed_inserts == []
    copy_database(tmp_path / "live.db", tmp_path / "initial.db")
    with sqlite3.connect(tmp_path / "live.db") as c:  # the "server" keeps a connection open
        c.execute("DELETE FROM users")
        c.commit()
        copy_database(tmp_path / "initial.db", tmp_path / "live.db")
        assert c.execute("SELECT count(*) FROM users").fetchone()[0] == 3


def test_hub_source_reads_the_hf_cache_offline(tmp_path, samples, monkeypatch):
    """The Hub code path resolves files with hf_hub_download against a cache laid out like huggingface_hub's."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = tmp_path / "hub" / ("datasets--" + HUB_REPO_ID.replace("/", "--"))
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    for f in FILES.values():
        if (samples / f).exists():
            os.symlink(samples / f, snap / f)  # a link into ../shared, nothing copied
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    src = ScenarioSource.from_hub(cache_dir=tmp_path / "hub")
    assert src.path("gen_tasks.jsonl").resolve() == (samples / "gen_tasks.jsonl").resolve()
    assert len(src.load("content_platform_1").tasks) == 10
    (snap / "gen_envs.jsonl").unlink()
    with pytest.raises(ScenarioError, match="not in the Hugging Face cache.*offline"):
        ScenarioSource.from_hub(cache_dir=tmp_path / "hub").load("content_platform_1")
    shutil.rmtree(tmp_path / "hub")


def test_verifier_function_rule():
    assert verifier_function("import x\ndef verify_task_completion(a, b):\n  pass", "code") == "verify_task_completion"
    assert verifier_function("def helper():\n  pass", "sql") == "verify_task"


def test_the_scenarios_sql_cannot_attach_or_write_host_files(tmp_path):
    """The DDL and sample rows are generated SQL, run by the host: ATTACH (opens or creates any file) and
    VACUUM INTO (writes one) are refused; the failing DDL and the failing INSERT are recorded."""
    import dataclasses

    bundled = Path(__file__).resolve().parents[4] / "data" / "awm_scenarios"
    sc = ScenarioSource.from_dir(bundled).load("library_1")
    planted = tmp_path / "planted.db"
    schema = {"tables": [*sc.db_schema["tables"], {"ddl": f"ATTACH DATABASE '{planted}' AS planted"}]}
    report = build_database(dataclasses.replace(sc, db_schema=schema), tmp_path / "a.db")
    assert len(report.failed_tables) == 1 and "not authorized" in report.failed_tables[0], report
    assert report.tables == len(sc.db_schema["tables"]) and not planted.exists()  # the rest is served
    samples = {"tables": [{"insert_statements": [f"VACUUM INTO '{planted}'"]}, *sc.sample_data["tables"]]}
    report = build_database(dataclasses.replace(sc, sample_data=samples), tmp_path / "b.db")
    assert report.failed_inserts and "sample_data.tables[0].insert_statements[0]" in report.failed_inserts[0]
    assert report.inserts > 0 and not planted.exists()
