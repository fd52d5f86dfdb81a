"""SQLite state of an AWM scenario: build from schema + sample rows, snapshot, restore.

The host builds the initial database from the scenario's SQL and hands the sandboxed server
its bytes (an *image*); from then on the live database exists only inside the sandbox, and its
bytes cross back through descriptors, capped at :data:`MAX_IMAGE_BYTES`. The scenario's SQL
is generated too: it runs with attaching other database files disabled (no ``ATTACH`` or
``VACUUM INTO`` of a host path). Copies between files the host itself made use SQLite's online
backup API (consistent even while another connection is open).
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from ....sandbox import hostio
from .source import Scenario, ScenarioError

#: Largest database image that crosses the sandbox boundary (a server's tmpfs holds no bigger one).
MAX_IMAGE_BYTES = 256 << 20
_ATTACH_DETACH = (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH)


def _no_attach(action: int, *_args) -> int:
    """SQLite authorizer: generated SQL may not attach (open or create) another database file."""
    return sqlite3.SQLITE_DENY if action in _ATTACH_DETACH else sqlite3.SQLITE_OK


def _connect_for_generated_sql(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # VACUUM INTO attaches its target too
    conn.set_authorizer(_no_attach)
    return conn


@dataclass
class BuildReport:
    """What building a database did: tables created, rows inserted, what failed (each with its field)."""

    tables: int = 0
    inserts: int = 0
    failed_tables: list[str] = field(default_factory=list)  # "db_schema.tables[i].ddl (table name): error"
    failed_inserts: list[str] = field(default_factory=list)  # "sample_data.tables[i].insert_statements[j]: error"

    def summary(self) -> str:
        """One line for a log: counts, then every failure."""
        failed = self.failed_tables + self.failed_inserts
        return (
            f"{self.tables} tables, {self.inserts} rows inserted"
            + (f"; {len(self.failed_tables)} table definitions failed" if self.failed_tables else "")
            + (f"; {len(self.failed_inserts)} inserts failed" if self.failed_inserts else "")
            + (f": {' | '.join(failed)}" if failed else "")
        )


def build_database(scenario: Scenario, path: str | Path, *, strict_inserts: bool = False) -> BuildReport:
    """Create ``path`` from the scenario's DDL, indexes and sample INSERTs, as the official AWM package does.

    A table whose DDL or index fails is recorded in the report and the rest is built (the
    official ``create_sqlite_database`` logs such a table and goes on; a failing index, like
    there, skips that table's remaining indexes). Sample rows go in with foreign-key checks on
    (the official ``execute_sample_data``), so a row pointing at a missing parent is a failed
    insert, recorded in the report unless ``strict_inserts``. A schema of which no table could
    be created is one :class:`ScenarioError`: there is nothing to serve.
    """
    path = Path(path)
    schema = scenario.require("db_schema")
    if path.exists():
        path.unlink()
    report = BuildReport()
    where = dict(scenario=scenario.name, source=scenario.sources.get("db_schema", ""))
    conn = _connect_for_generated_sql(path)
    try:
        for i, table in enumerate(schema["tables"]):
            _create_table(conn, i, table, report)
        conn.commit()
        if not _table_names(conn):
            why = report.failed_tables[0] if report.failed_tables else "the schema defines no table"
            raise ScenarioError(
                f"no table could be created ({len(report.failed_tables)} of {len(schema['tables'])} definitions "
                f"failed; first: {why})",
                field="db_schema.tables",
                **where,
            )
        conn.execute("PRAGMA foreign_keys = ON")
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


def _create_table(conn: sqlite3.Connection, i: int, table: dict, report: BuildReport) -> None:
    """Run one table's DDL and indexes; the first failure is recorded and ends this table's statements."""
    here, name = f"db_schema.tables[{i}]", f" (table {table['name']})" if table.get("name") else ""
    try:
        conn.execute(table["ddl"])
    except sqlite3.Error as exc:
        report.failed_tables.append(f"{here}.ddl{name}: {exc}")
        return
    report.tables += 1
    for j, stmt in enumerate(table.get("indexes") or []):
        if not stmt.strip():
            continue
        try:
            conn.execute(stmt)
        except sqlite3.Error as exc:
            report.failed_tables.append(f"{here}.indexes[{j}]{name}: {exc}")
            return


def _table_names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]


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


def build_image(
    scenario: Scenario, work_dir: str | Path, *, strict_inserts: bool = False
) -> tuple[BuildReport, bytes]:
    """Build the scenario's initial database in ``work_dir`` (a host-private directory) and return its bytes."""
    path = Path(work_dir) / "initial.db"
    report = build_database(scenario, path, strict_inserts=strict_inserts)
    try:
        fd = hostio.open_regular(path)
        try:
            return report, hostio.read_bounded(fd, MAX_IMAGE_BYTES, f"the initial database of {scenario.name}")
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
