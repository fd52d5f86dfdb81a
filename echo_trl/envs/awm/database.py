"""SQLite state of an AWM scenario: build from schema + sample rows, snapshot, restore.

Copies use SQLite's online backup API (consistent even while the scenario server holds open
connections; ~3 ms for an AWM database), never a file copy of a database in use.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from .scenario import Scenario, ScenarioError


@dataclass
class BuildReport:
    """What building a database did: tables created, rows inserted, statements that failed."""

    tables: int = 0
    inserts: int = 0
    failed_inserts: list[str] = field(default_factory=list)  # "sample_data.tables[i].insert_statements[j]: error"


def build_database(scenario: Scenario, path: str | Path, *, strict_inserts: bool = False) -> BuildReport:
    """Create ``path`` from the scenario's DDL, indexes and sample INSERTs.

    A failing DDL or index statement is a :class:`ScenarioError` naming the field (the server
    cannot work without its tables); a failing sample INSERT is recorded in the report (real
    AWM data has the odd bad row) unless ``strict_inserts``.
    """
    path = Path(path)
    schema = scenario.require("db_schema")
    if path.exists():
        path.unlink()
    report = BuildReport()
    where = dict(scenario=scenario.name, source=scenario.sources.get("db_schema", ""))
    conn = sqlite3.connect(path)
    try:
        for i, table in enumerate(schema["tables"]):
            try:
                conn.execute(table["ddl"])
            except sqlite3.Error as exc:
                raise ScenarioError(f"DDL failed: {exc}", field=f"db_schema.tables[{i}].ddl", **where) from None
            for j, stmt in enumerate(table.get("indexes") or []):
                if not stmt.strip():
                    continue
                try:
                    conn.execute(stmt)
                except sqlite3.Error as exc:
                    raise ScenarioError(
                        f"index failed: {exc}", field=f"db_schema.tables[{i}].indexes[{j}]", **where
                    ) from None
            report.tables += 1
        samples = scenario.sample_data or {"tables": []}
        for i, table in enumerate(samples["tables"]):
            for j, stmt in enumerate(table["insert_statements"]):
                if not stmt.strip():
                    continue
                try:
                    conn.execute(stmt)
                    report.inserts += 1
                except sqlite3.Error as exc:
                    here = f"sample_data.tables[{i}].insert_statements[{j}]"
                    if strict_inserts:
                        raise ScenarioError(
                            f"INSERT failed: {exc}",
                            field=here,
                            scenario=scenario.name,
                            source=scenario.sources.get("sample_data", ""),
                        ) from None
                    report.failed_inserts.append(f"{here}: {exc}")
        conn.commit()
    except BaseException:
        conn.close()
        path.unlink(missing_ok=True)
        raise
    conn.close()
    return report


def copy_database(src: str | Path, dst: str | Path) -> None:
    """Overwrite ``dst`` with a consistent copy of ``src`` (SQLite backup API).

    Works while other connections (the scenario server) have ``dst`` open: they see the
    restored state at their next transaction.
    """
    source = sqlite3.connect(f"file:{Path(src)}?mode=ro", uri=True)
    try:
        target = sqlite3.connect(dst, timeout=10.0)
        try:
            source.backup(target)
        finally:
            target.close()
    finally:
        source.close()
