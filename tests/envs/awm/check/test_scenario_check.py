"""The health check on real scenarios: the bundled library_1, the AWM-1K samples, and scenarios built to fail.

Expectations come from outside the check: the defects the helpers built (tests/helpers/awm_defects.py), the
tool lists the upstream server answered (tests/fixtures/upstream_awm), what the official ``awm env reset_db``
made of the same data (official_reset_db.json), and the known defects of the samples (../shared/data/README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.awm_defects import (
    BROKEN_TABLE,
    BUNDLED,
    EXPECTED,
    SERVER_ERROR,
    VERIFIER_ERROR,
    broken_table_rows,
    write_scenarios,
)
from helpers.shared_data import AWM1K_SAMPLES, REPO, require_shared

from echo_trl.envs.awm.check.report import comparable
from echo_trl.envs.awm.check.run import CheckSettings, check_scenarios
from echo_trl.envs.awm.scenario.source import ScenarioSource

UPSTREAM = REPO / "tests" / "fixtures" / "upstream_awm"
OFFICIAL = json.loads((UPSTREAM / "official_reset_db.json").read_text(encoding="utf-8"))
pytestmark = [pytest.mark.slow, pytest.mark.sandbox]  # starts contained scenario servers and verifier processes


def _check(data: Path, output: Path, **kwargs) -> dict:
    return check_scenarios(ScenarioSource.from_dir(data), CheckSettings(output=output, concurrency=2, **kwargs))


def _by_name(report: dict) -> dict[str, dict]:
    return {r["scenario"]: r for r in report["scenarios"]}


@pytest.fixture(scope="module")
def defects(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("defects")
    data = write_scenarios(root / "data")
    return root, _check(data, root / "check")


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict:
    require_shared(AWM1K_SAMPLES)
    return _check(AWM1K_SAMPLES, tmp_path_factory.mktemp("samples") / "check")


def _outcomes(result: dict) -> dict[int, str]:
    return {t["task_idx"]: t["outcome"] for t in result["tasks"]}


def test_every_generated_defect_is_named(defects):
    results = _by_name(defects[1])
    assert sorted(results) == sorted(EXPECTED)
    for name, (status, outcomes) in EXPECTED.items():
        assert (results[name]["status"], _outcomes(results[name])) == (status, outcomes), name

    seed = results["library_seed_fails"]["database"]
    ddl = [s for s in seed["failed_statements"] if ".ddl" in s]
    inserts = [s for s in seed["failed_statements"] if "insert_statements" in s]
    assert len(ddl) == 1 and f"(table {BROKEN_TABLE})" in ddl[0] and "syntax error" in ddl[0]
    assert len(inserts) == broken_table_rows() and all(f"no such table: {BROKEN_TABLE}" in s for s in inserts)

    server = results["library_server_fails"]
    assert server["server"]["started"] is False and server["server"]["tools"] is None
    assert server["unusable_because"].startswith("server not started: the scenario server exited during start-up")
    assert server["unusable_because"].endswith(f"RuntimeError: {SERVER_ERROR}")

    raises = {t["task_idx"]: t["reason"] for t in results["library_verifier_raises"]["tasks"]}
    assert raises[0] == f"ValueError: line 2: {VERIFIER_ERROR}"
    assert raises[1].startswith("SyntaxError: line 1:")
    (compile_error,) = results["library_verifier_raises"]["verifiers"]["compile_errors"]
    assert (
        compile_error.startswith("task 1 code verifier (gen_verifier.pure_code.jsonl:")
        and "SyntaxError" in compile_error
    )

    satisfied = results["library_already_satisfied"]["tasks"][0]
    assert "'complete' on the untouched database" in satisfied["reason"]


def test_the_untouched_database_is_what_a_verify_only_rollout_is_judged_on(defects):
    """The check's already_satisfied task, played live as a rollout whose only action is verify: complete."""
    from echo_trl.envs.awm.runtime.pool import ServerPool

    root, report = defects
    source = ScenarioSource.from_dir(root / "data")
    with ServerPool(1) as pool:
        pool.add(source.load("library_already_satisfied"))
        for task_idx, outcome in EXPECTED["library_already_satisfied"][1].items():
            episode = pool.new_episode("library_already_satisfied", task_idx)
            episode.verify()
            episode.close()
            assert episode.reward_type == ("complete" if outcome == "already_satisfied" else "others")


def test_the_database_results_agree_with_the_official_reset_db(defects):
    for name, result in _by_name(defects[1]).items():
        _assert_agrees(result, OFFICIAL["defects"][name])


def _assert_agrees(result: dict, official: dict) -> None:
    db = result["database"]
    failed_inserts = [s for s in db["failed_statements"] if "insert_statements" in s]
    assert (db["tables"], db["rows"], len(failed_inserts)) == (
        official["tables"],
        official["successful_inserts"],
        official["failed_inserts"],
    ), result["scenario"]
    # reset_db lists a scenario "with errors" for failed inserts or no sample rows: the check names both
    assert any(p.startswith("database") for p in result["problems"]) == official["has_error"], result["scenario"]


def test_a_rerun_reuses_unchanged_results_and_reports_the_same(defects):
    root, report = defects
    again = _check(root / "data", root / "check")
    assert again["run"]["checked"] == 0 and again["run"]["reused"] == len(EXPECTED)
    assert comparable(again) == comparable(report)
    assert json.loads((root / "check" / "scenario_report.json").read_text()) == again


def test_the_bundled_scenario_is_healthy(tmp_path):
    report = _check(BUNDLED, tmp_path / "check")
    (library,) = report["scenarios"]
    upstream = json.loads((UPSTREAM / "list_tools.library_1.json").read_text(encoding="utf-8"))
    assert library["scenario"] == "library_1" and library["status"] == "ok" and library["problems"] == []
    assert library["server"]["tools"] == len(upstream["data"]["observation"]["tools"])
    # every bundled task needs a change the seed data lacks (data/awm_scenarios/solutions.jsonl makes it)
    assert _outcomes(library) == dict.fromkeys(range(10), "ok")
    assert report["summary"]["usable_tasks"] == 10


def test_the_samples_known_defects_are_named(samples):
    results = _by_name(samples)
    assert sorted(results) == ["code_hosting_2", "content_platform_1", "e_commerce_33"]  # the ones with tasks
    for name, result in results.items():
        _assert_agrees(result, OFFICIAL["awm1k_samples"][name])
    # ../shared/data/README.md: gen_verifier.jsonl line 3 (e_commerce_33 task 2) is a SyntaxError
    shop = results["e_commerce_33"]
    (broken,) = shop["verifiers"]["compile_errors"]
    assert broken.startswith("task 2 sql verifier (gen_verifier.jsonl:3): SyntaxError: line ")
    # ... no server code, verifiers for tasks 0-2 (task 0's always returns "others")
    assert shop["status"] == "unusable" and "no record in gen_envs.jsonl" in shop["unusable_because"]
    outcomes = _outcomes(shop)
    assert outcomes[0] == "ok" and {outcomes[1], outcomes[2]} <= {"ok", "already_satisfied"}
    assert [k for k, o in outcomes.items() if o == "no_verifier"] == list(range(3, 10))
    # the tool counts the README table gives; no verifiers in either
    for name, tools in (("content_platform_1", 34), ("code_hosting_2", 61)):
        assert results[name]["server"] == {"started": True, "tools": tools, "error": None}
        assert set(_outcomes(results[name]).values()) == {"no_verifier"}
    assert samples["summary"]["usable_tasks"] == 0
