"""Small AWM scenarios built to fail each way a health check must name, from the bundled ``library_1``.

Each scenario is a renamed copy of ``data/awm_scenarios``' ``library_1`` (its first ``TASKS`` tasks and their
code verifiers) with one defect, written as AWM-1K ``gen_*.jsonl`` files:

* ``library_seed_fails``: the DDL of its last table (``reading_list_items``) is broken, so that table is missing
  and every sample row for it fails to insert (the rest of the database is built);
* ``library_server_fails``: the server code raises at import, so the server never starts;
* ``library_verifier_raises``: task 0's verifier raises at run time, task 1's does not compile;
* ``library_already_satisfied``: task 0's verifier passes on the untouched initial database (an agent that does
  nothing scores "complete"); task 1 is library_1's own.

What the check must report for each is in :data:`EXPECTED` (written from the defects above, not from a run).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # (no pytest here: the official package's interpreter imports this too)

BUNDLED = REPO / "data" / "awm_scenarios"
TASKS = 2
SERVER_ERROR = "the generated server is broken on purpose"
VERIFIER_ERROR = "the verifier is broken on purpose"
BROKEN_TABLE = "reading_list_items"

RAISES = (
    "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
    f"    raise ValueError({VERIFIER_ERROR!r})\n"
)
DOES_NOT_COMPILE = "def verify_task_completion(initial_db_path, final_db_path, final_answer=None:\n    return {}\n"
ALREADY_SATISFIED = (
    "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
    "    import sqlite3\n"
    "    conn = sqlite3.connect(final_db_path)\n"
    "    members = conn.execute('SELECT COUNT(*) FROM members').fetchone()[0]\n"
    "    return {'result': 'complete' if members > 0 else 'others'}\n"
)

#: scenario -> (status, {task_idx: outcome}) the check must give.
EXPECTED = {
    "library_seed_fails": ("database_errors", {0: "ok", 1: "ok"}),
    "library_server_fails": ("unusable", {0: "ok", 1: "ok"}),
    "library_verifier_raises": ("ok", {0: "verifier_error", 1: "verifier_error"}),
    "library_already_satisfied": ("ok", {0: "already_satisfied", 1: "ok"}),
}


def bundled_records() -> dict[str, dict]:
    """library_1's record of each gen_*.jsonl file (verifiers: a list, one per task)."""
    out: dict[str, dict] = {}
    for path in sorted(BUNDLED.glob("gen_*.jsonl")):
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        out[path.name] = records if path.name.startswith("gen_verifier") else records[0]
    return out


def _renamed(records: dict[str, object], name: str) -> dict[str, object]:
    out = copy.deepcopy(records)
    for key, rec in out.items():
        for r in rec if isinstance(rec, list) else [rec]:
            r["name" if key == "gen_scenario.jsonl" else "scenario"] = name
    out["gen_tasks.jsonl"]["tasks"] = out["gen_tasks.jsonl"]["tasks"][:TASKS]
    out["gen_verifier.pure_code.jsonl"] = [r for r in out["gen_verifier.pure_code.jsonl"] if r["task_idx"] < TASKS]
    return out


def _set_verifier(records: dict, task_idx: int, code: str) -> None:
    (rec,) = [r for r in records["gen_verifier.pure_code.jsonl"] if r["task_idx"] == task_idx]
    rec["verification"]["code"] = code


def defective_scenarios() -> dict[str, dict[str, object]]:
    """{scenario name: its records per gen_*.jsonl file}, one defect each (see the module docstring)."""
    base = bundled_records()
    out = {}

    seed = _renamed(base, "library_seed_fails")
    (table,) = [t for t in seed["gen_db.jsonl"]["db_schema"]["tables"] if t["name"] == BROKEN_TABLE]
    table["ddl"] = f"CREATE TABLE {BROKEN_TABLE} (id INTEGER PRIMARY KEY,, list_id INTEGER)"
    out["library_seed_fails"] = seed

    server = _renamed(base, "library_server_fails")
    server["gen_envs.jsonl"]["full_code"] += f"\n\nraise RuntimeError({SERVER_ERROR!r})\n"
    out["library_server_fails"] = server

    raises = _renamed(base, "library_verifier_raises")
    _set_verifier(raises, 0, RAISES)
    _set_verifier(raises, 1, DOES_NOT_COMPILE)
    out["library_verifier_raises"] = raises

    satisfied = _renamed(base, "library_already_satisfied")
    _set_verifier(satisfied, 0, ALREADY_SATISFIED)
    out["library_already_satisfied"] = satisfied
    return out


def broken_table_rows() -> int:
    """How many of library_1's sample rows go into the table whose DDL ``library_seed_fails`` breaks."""
    tables = bundled_records()["gen_sample.jsonl"]["sample_data"]["tables"]
    return sum(len(t["insert_statements"]) for t in tables if t["table_name"] == BROKEN_TABLE)


def write_scenarios(directory: Path, scenarios: dict[str, dict[str, object]] | None = None) -> Path:
    """Write ``scenarios`` (default: :func:`defective_scenarios`) as AWM-1K gen_*.jsonl files in ``directory``."""
    scenarios = defective_scenarios() if scenarios is None else scenarios
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}
    for records in scenarios.values():
        for name, rec in records.items():
            for r in rec if isinstance(rec, list) else [rec]:
                files.setdefault(name, []).append(json.dumps(r))
    for name, lines in files.items():
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def serverless_scenario(name: str = "library_no_server") -> dict[str, dict[str, object]]:
    """A scenario without server code whose task 0 is already satisfied: a check of it starts no server (cheap),
    builds its database and runs its two verifiers. ``{name: records}``, for :func:`write_scenarios`."""
    records = _renamed(bundled_records(), name)
    del records["gen_envs.jsonl"]
    _set_verifier(records, 0, ALREADY_SATISFIED)
    return {name: records}
