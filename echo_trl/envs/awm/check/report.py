"""The scenario report: what each outcome means, the report assembled from per-scenario results, its text form.

A per-scenario result (written by :mod:`~echo_trl.envs.awm.check.scenario_check`) is a JSON object::

    {"scenario", "digest", "status": ok | database_errors | unusable, "unusable_because", "problems": [str],
     "database": {"built", "tables", "rows", "failed_statements": [str], "error"},
     "server": {"started", "tools", "error"},
     "verifiers": {"code", "sql", "compile_errors": [str]},
     "tasks": [{"task_idx", "outcome", "reason", "verifier"}]}

Task outcomes (the task's code verifier run against the untouched initial database, as a rollout that only
calls ``verify`` would see it): ``ok`` (it runs and does not pass), ``already_satisfied`` (it passes: doing
nothing scores "complete"), ``verifier_error`` (it does not compile, raises, hangs or returns no verdict),
``no_verifier`` (the dataset has no code verifier for the task: every episode would score ``no_verifier``) and
``not_checked`` (no initial database to run it on). Only ``ok`` tasks of usable scenarios are usable.

Why the report is comparable across reruns: scenarios are sorted by name, tasks by index, every message is
free of times, process ids and paths; what differs from run to run (seconds, how many results were reused,
the containment) is kept under ``run`` alone.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..scenario.source import FILES, Scenario

#: Bumped when a check would give other results for the same data: results of another version are not reused.
CHECK_VERSION = 1
TASK_OUTCOMES = ("ok", "already_satisfied", "verifier_error", "no_verifier", "not_checked")
SCENARIO_STATUSES = ("ok", "database_errors", "unusable")
REPORT_KIND = "echo-trl check-scenarios"
#: The file names a check writes into its output directory (and capture's, with ``--check``).
REPORT_FILE = "scenario_report.json"
RESULTS_FILE = "scenario_check.jsonl"
STATE_FILE = "scenario_check_state.json"
LOCK_FILE = ".scenario_check.lock"
MAX_REASON_CHARS = 300


def one_line(text: Any, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` on one line (whitespace collapsed), cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def scenario_digest(scenario: Scenario) -> str:
    """A digest of everything the check reads of ``scenario``: a stored result is reused only for the same data."""
    content = {
        "version": CHECK_VERSION,
        "name": scenario.name,
        "tasks": scenario.tasks,
        "db_schema": scenario.db_schema,
        "sample_data": scenario.sample_data,
        "env_code": scenario.env_code,
        "verifiers": sorted((k, mode, spec.code) for (k, mode), spec in scenario.verifiers.items()),
    }
    return "sha256:" + hashlib.sha256(json.dumps(content, sort_keys=True).encode("utf-8", "surrogatepass")).hexdigest()


def task_usable(scenario_result: dict[str, Any], task: dict[str, Any]) -> bool:
    return scenario_result["status"] != "unusable" and task["outcome"] == "ok"


def summarize(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counts by scenario status and by task outcome, and how many of each are usable."""
    results = list(results)
    statuses = Counter(r["status"] for r in results)
    outcomes = Counter(t["outcome"] for r in results for t in r["tasks"])
    return {
        "scenarios": len(results),
        "scenarios_by_status": {s: statuses[s] for s in SCENARIO_STATUSES},
        "usable_scenarios": sum(r["status"] != "unusable" for r in results),
        "tasks": sum(outcomes.values()),
        "tasks_by_outcome": {o: outcomes[o] for o in TASK_OUTCOMES},
        "usable_tasks": sum(task_usable(r, t) for r in results for t in r["tasks"]),
    }


def assemble_report(
    results: Iterable[dict[str, Any]], *, source: str, settings: dict[str, Any], run: dict[str, Any]
) -> dict[str, Any]:
    """The report: the sorted results and their summary (comparable), then ``run`` (not comparable)."""
    ordered = sorted(results, key=lambda r: r["scenario"])
    return {
        "report": REPORT_KIND,
        "version": CHECK_VERSION,
        "source": source,
        "settings": dict(sorted(settings.items())),
        "summary": summarize(ordered),
        "scenarios": ordered,
        "run": run,
    }


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The part of a report that is the same on every rerun over the same data (all but ``run``)."""
    return {k: v for k, v in report.items() if k != "run"}


# --------------------------------------------------------------------------------------------
# Text


def task_ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"tasks 0-2, 5"`` (``"task 3"`` for one)."""
    parts, start = [], None
    for i, k in enumerate(indices):
        if start is None:
            start = k
        if i + 1 == len(indices) or indices[i + 1] != k + 1:
            parts.append(str(start) if start == k else f"{start}-{k}")
            start = None
    return ("task " if len(indices) == 1 else "tasks ") + ", ".join(parts)


def problem_lines(results: Iterable[dict[str, Any]]) -> list[str]:
    """One line per scenario problem, and per group of a scenario's tasks with the same outcome and reason."""
    lines = []
    for r in results:
        name = r["scenario"]
        if r["status"] == "unusable":
            lines.append(f"{name}: UNUSABLE: {r['unusable_because']}")
        lines += [f"{name}: {p}" for p in r["problems"] if p != r.get("unusable_because")]
        groups: dict[tuple[str, str], list[int]] = {}
        for t in r["tasks"]:
            if t["outcome"] != "ok":
                groups.setdefault((t["outcome"], t["reason"]), []).append(t["task_idx"])
        for (outcome, reason), ks in sorted(groups.items(), key=lambda g: g[1][0]):
            lines.append(f"{name} {task_ranges(ks)}: {outcome}: {reason}")
    return lines


def _database_cell(db: dict[str, Any]) -> str:
    if not db["built"]:
        return "NOT BUILT"
    failed = len(db["failed_statements"])
    return f"{db['tables']} tables, {db['rows']} rows" + (f", {failed} failed" if failed else "")


def _tasks_cell(tasks: list[dict[str, Any]]) -> str:
    counts = Counter(t["outcome"] for t in tasks)
    return ", ".join(f"{counts[o]} {o}" for o in TASK_OUTCOMES if counts[o]) or "no tasks"


def report_lines(report: dict[str, Any]) -> list[str]:
    """The summary table a person reads: a row per scenario, counts by outcome, every problem on one line."""
    results, summary = report["scenarios"], report["summary"]
    header = ("scenario", "status", "database", "server", "tools", "verifiers", "tasks")
    rows = [header]
    for r in results:
        server, ver = r["server"], r["verifiers"]
        bad = len(ver["compile_errors"])
        rows.append(
            (
                r["scenario"],
                r["status"],
                _database_cell(r["database"]),
                "started" if server["started"] else "NOT STARTED",
                "-" if server["tools"] is None else str(server["tools"]),
                f"{ver['code']} code, {ver['sql']} sql" + (f" ({bad} not compiling)" if bad else ""),
                _tasks_cell(r["tasks"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]]) for row in rows]
    statuses = ", ".join(f"{s} {n}" for s, n in summary["scenarios_by_status"].items())
    outcomes = ", ".join(f"{o} {n}" for o, n in summary["tasks_by_outcome"].items())
    lines += [
        "",
        f"scenarios: {summary['scenarios']} ({statuses}); usable: {summary['usable_scenarios']}",
        f"tasks: {summary['tasks']} ({outcomes}); usable: {summary['usable_tasks']}",
    ]
    problems = problem_lines(results)
    lines += ["problems:", *(f"  {p}" for p in problems)] if problems else ["problems: none"]
    return lines


def missing_part(part: str) -> str:
    """Why a scenario part is absent, naming the dataset file it would come from."""
    return f"no record in {FILES[part]}"
