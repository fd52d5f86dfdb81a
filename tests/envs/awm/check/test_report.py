"""The report's pure parts: counts, the text table, reading a report back, and what it makes callers skip."""

from __future__ import annotations

import json

import pytest

from echo_trl.envs.awm.check.report import (
    REPORT_FILE,
    assemble_report,
    comparable,
    problem_lines,
    report_lines,
    scenario_digest,
    task_ranges,
)
from echo_trl.envs.awm.check.usable import ReportError, ScenarioReport, usable_selection
from echo_trl.envs.awm.scenario.source import Scenario, VerifierSpec


def _scenario(name: str, tasks: int = 3) -> Scenario:
    return Scenario(name, tasks=[f"task {k}" for k in range(tasks)], env_code="app = 1\n", db_schema={"tables": []})


def _result(sc: Scenario, outcomes: list[str], status: str = "ok", why: str | None = None) -> dict:
    return {
        "scenario": sc.name,
        "status": status,
        "unusable_because": why,
        "problems": [why] if why else [],
        "digest": scenario_digest(sc),
        "database": {"built": True, "tables": 2, "rows": 5, "failed_statements": [], "error": None},
        "server": {"started": status != "unusable", "tools": 3 if status != "unusable" else None, "error": why},
        "verifiers": {"code": len(outcomes), "sql": 0, "compile_errors": []},
        "tasks": [
            {"task_idx": k, "outcome": o, "reason": f"reason {o}", "verifier": None} for k, o in enumerate(outcomes)
        ],
    }


SHOP, BLOG, WIKI = _scenario("shop"), _scenario("blog"), _scenario("wiki")
RESULTS = [
    _result(SHOP, ["ok", "already_satisfied", "verifier_error"]),
    _result(BLOG, ["ok", "ok", "no_verifier"], status="unusable", why="server not started: boom"),
    _result(WIKI, ["ok", "ok", "ok"]),
]


def _report(results=RESULTS) -> dict:
    return assemble_report(results, source="data", settings={"verifier_timeout": 30.0}, run={"seconds": 1.0})


def test_task_ranges():
    assert task_ranges([3]) == "task 3"
    assert task_ranges([0, 1, 2, 5, 7, 8]) == "tasks 0-2, 5, 7-8"


def test_summary_counts_and_usable_tasks():
    summary = _report()["summary"]
    assert summary["scenarios"] == 3 and summary["usable_scenarios"] == 2
    assert summary["scenarios_by_status"] == {"ok": 2, "database_errors": 0, "unusable": 1}
    assert summary["tasks_by_outcome"] == {
        "ok": 6,  # shop 1, blog 2, wiki 3
        "already_satisfied": 1,
        "verifier_error": 1,
        "no_verifier": 1,
        "not_checked": 0,
    }
    assert summary["usable_tasks"] == 4  # shop 0, wiki 0-2: blog's ok tasks are in an unusable scenario


def test_report_is_sorted_and_its_comparable_part_leaves_out_the_run():
    report = _report()
    assert [r["scenario"] for r in report["scenarios"]] == ["blog", "shop", "wiki"]
    shuffled = _report([RESULTS[2], RESULTS[0], RESULTS[1]])
    shuffled["run"] = {"seconds": 99.0}
    assert comparable(shuffled) == comparable(report) and "run" not in comparable(report)


def test_table_and_problem_lines():
    lines = report_lines(_report())
    assert lines[0].split() == ["scenario", "status", "database", "server", "tools", "verifiers", "tasks"]
    assert lines[1].split()[:2] == ["blog", "unusable"] and "NOT STARTED" in lines[1]
    assert "tasks: 9 (ok 6, already_satisfied 1, verifier_error 1, no_verifier 1, not_checked 0); usable: 4" in lines
    assert problem_lines(_report()["scenarios"]) == [
        "blog: UNUSABLE: server not started: boom",
        "blog task 2: no_verifier: reason no_verifier",
        "shop task 1: already_satisfied: reason already_satisfied",
        "shop task 2: verifier_error: reason verifier_error",
    ]


def test_usable_selection_skips_and_says_why():
    report = ScenarioReport.from_report(_report())
    kept, tasks, skipped = usable_selection(report, [SHOP, BLOG, WIKI])
    assert [sc.name for sc in kept] == ["shop", "wiki"]
    assert tasks == {"shop": [0], "wiki": [0, 1, 2]}
    assert skipped.scenarios == {"blog": "server not started: boom"}
    assert skipped.tasks == {
        ("shop", 1): ("already_satisfied", "reason already_satisfied"),
        ("shop", 2): ("verifier_error", "reason verifier_error"),
    }
    assert skipped.lines(hint="--include_unusable") == [
        "skipped: 1 scenario(s): blog (server not started: boom)",
        "skipped: 1 task(s) already_satisfied: shop task 1",
        "skipped: 1 task(s) verifier_error: shop task 2",
        "(the scenario report says why; --include_unusable keeps them)",
    ]
    # asked-for tasks only; include_unusable keeps everything and still lists it
    _, tasks, _ = usable_selection(report, [SHOP], {"shop": [1, 0]})
    assert tasks == {"shop": [0]}
    kept, tasks, skipped = usable_selection(report, [SHOP, BLOG], include_unusable=True)
    assert tasks == {"shop": [0, 1, 2], "blog": [0, 1, 2]} and skipped.included
    assert skipped.lines()[0].startswith("kept although the scenario report marks them unusable: 1 scenario(s)")


def test_a_report_is_only_trusted_for_the_data_it_was_made_from(tmp_path):
    report = ScenarioReport.from_report(_report())
    changed = _scenario("shop")
    changed.verifiers[(0, "code")] = VerifierSpec("shop", 0, "code", "def verify_x(): pass", "verify_x", "f:1")
    with pytest.raises(ReportError, match="scenario 'shop' was checked on other data"):
        usable_selection(report, [changed])
    with pytest.raises(ReportError, match="has no result for scenario 'news'"):
        usable_selection(report, [_scenario("news")])


def test_loading_a_report_names_what_is_wrong(tmp_path):
    (tmp_path / REPORT_FILE).write_text(json.dumps(_report()))
    assert sorted(ScenarioReport.load(tmp_path).results) == ["blog", "shop", "wiki"]  # the directory holding it
    with pytest.raises(ReportError, match="no such file"):
        ScenarioReport.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    for text, message in (
        ("{", "not a readable JSON report"),
        ('{"a": 1}', "not a scenario report"),
        (json.dumps({**_report(), "version": 0}), "version: made by another version"),
        (json.dumps({**_report(), "scenarios": [{"scenario": "x", "status": "ok"}]}), r"scenarios\[0\].tasks"),
    ):
        bad.write_text(text)
        with pytest.raises(ReportError, match=message):
            ScenarioReport.load(bad)


def test_build_dataset_never_reads_the_checks_files_as_episodes():
    """``capture --check`` writes the check's files into the capture output, which build-dataset reads."""
    from echo_trl.data.readers.episode_files import OWN_REPORTS
    from echo_trl.envs.awm.check.report import RESULTS_FILE, STATE_FILE

    assert {RESULTS_FILE, STATE_FILE, REPORT_FILE} <= set(OWN_REPORTS)
