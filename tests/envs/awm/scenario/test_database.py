"""The database build against the official AWM package's (tests/fixtures/upstream_awm/official_db.json)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from echo_trl.commands.cli import main as cli
from echo_trl.envs.awm.scenario.database import build_database
from echo_trl.envs.awm.scenario.source import Scenario, ScenarioError

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "upstream_awm"
CASES = json.loads((FIXTURES / "db_cases.json").read_text(encoding="utf-8"))
OFFICIAL = json.loads((FIXTURES / "official_db.json").read_text(encoding="utf-8"))


def _scenario(name: str) -> Scenario:
    case = CASES[name]
    return Scenario(name, db_schema=case["db_schema"], sample_data=case["sample_data"], sources={"db_schema": "x:1"})


def _contents(path: Path) -> tuple[dict[str, int], list[str]]:
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = {t: conn.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
        indexes = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")
        ]
    return rows, sorted(indexes)


@pytest.mark.parametrize("name", ["orphan_row", "one_failing_table"])
def test_the_database_is_the_official_packages(tmp_path, name):
    official = OFFICIAL[name]
    report = build_database(_scenario(name), tmp_path / "live.db")
    assert _contents(tmp_path / "live.db") == (official["rows"], official["indexes"])
    assert report.inserts == official["successful_inserts"]
    assert len(report.failed_inserts) == official["failed_inserts"]
    assert len(report.failed_tables) == official["failed_tables"]


def test_foreign_keys_are_checked_while_inserting(tmp_path):
    report = build_database(_scenario("orphan_row"), tmp_path / "live.db")
    assert report.failed_inserts == ["sample_data.tables[1].insert_statements[2]: FOREIGN KEY constraint failed"]


def test_a_failing_table_definition_is_reported_and_the_rest_served(tmp_path):
    report = build_database(_scenario("one_failing_table"), tmp_path / "live.db")
    assert report.tables == 2  # members (its first index failed, as in the official package) and branches
    assert report.failed_tables[0].startswith("db_schema.tables[0].indexes[0] (table members): no such column")
    assert report.failed_tables[1].startswith("db_schema.tables[1].ddl (table loans): near")
    summary = report.summary()
    assert summary.startswith("2 tables, 3 rows inserted; 2 table definitions failed; 1 inserts failed: ")
    assert "db_schema.tables[1].ddl (table loans)" in summary and "no such table: loans" in summary


def test_nothing_servable_is_one_clear_error(tmp_path):
    assert OFFICIAL["nothing_servable"]["rows"] == {}  # the official package leaves an empty database
    with pytest.raises(ScenarioError) as err:
        build_database(_scenario("nothing_servable"), tmp_path / "live.db")
    message = str(err.value)
    assert "nothing_servable" in message and "db_schema.tables" in message
    assert "no table could be created (2 of 2 definitions failed; first: db_schema.tables[0].ddl (table a):" in message
    assert not (tmp_path / "live.db").exists()


def test_the_capture_log_names_a_failing_table(tmp_path):
    """A scenario with one bad table still captures; the capture log says what failed."""
    library = Path(__file__).resolve().parents[4] / "data" / "awm_scenarios"
    data = tmp_path / "data"
    data.mkdir()
    for f in library.glob("*.json*"):
        text = f.read_text(encoding="utf-8")
        if f.name == "gen_db.jsonl":
            rec = json.loads(text)
            rec["db_schema"]["tables"].append({"name": "broken", "ddl": "CREATE TABLE broken (", "indexes": []})
            text = json.dumps(rec) + "\n"
        (data / f.name).write_text(text, encoding="utf-8")
    replay = tmp_path / "r.jsonl"
    replay.write_text(json.dumps({"task_idx": 5, "calls": [{"tool_name": "list_branches", "arguments": {}}]}) + "\n")
    out = tmp_path / "out"
    args = ["capture", "--data", str(data), "--scenario", "library_1", "--policy", f"replay:{replay}"]
    assert cli([*args, "--output", str(out)]) == 0
    log = (out / "capture_log.txt").read_text()
    assert "database: 10 tables, 100 rows inserted; 1 table definitions failed: db_schema.tables[10].ddl" in log
    episode = json.loads((out / "library_1_task5.jsonl").read_text())
    assert episode["steps"][0]["observation"]["reward_type"] == "tool_call_ok"
