"""A collection skips what a scenario report marks unusable: by default, with the check run first (``check``), or
all of it kept on request (``include_unusable``), and what was skipped is said.

Scenarios from tests/helpers/awm_defects.py: one whose server does not start, one whose task 0 the untouched
database already satisfies. Every script plays no tool call, so each episode is a rollout that only calls verify.
"""

from __future__ import annotations

import json

import pytest
from helpers.awm_defects import defective_scenarios, write_scenarios

from echo_trl.data.readers.records import load_awm_episodes
from echo_trl.envs.awm.capture.run import CollectionSettings, collect
from echo_trl.envs.awm.policies.replay import ReplayPolicy
from echo_trl.envs.awm.scenario.source import ScenarioSource

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]  # starts contained scenario servers and verifiers

SATISFIED, BROKEN = "library_already_satisfied", "library_server_fails"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("capture")
    defects = defective_scenarios()
    source = ScenarioSource.from_dir(write_scenarios(root / "data", {n: defects[n] for n in (SATISFIED, BROKEN)}))
    scripts = root / "scripts.jsonl"
    scripts.write_text(
        "".join(
            json.dumps({"scenario": s, "task_idx": k, "calls": [], "verify": True}) + "\n"
            for s in (SATISFIED, BROKEN)
            for k in (0, 1)
        )
    )
    return root, source, ReplayPolicy.from_file(scripts)


def test_check_first_then_skip_what_it_marks_unusable(setup):
    root, source, policy = setup
    out = root / "checked"
    result = collect(CollectionSettings(output=out, scenarios=(SATISFIED, BROKEN), check=True), source, policy)
    assert result.tasks == {SATISFIED: [1]}  # the server that does not start and the satisfied task: skipped
    assert result.skipped[0].startswith(f"skipped: 1 scenario(s): {BROKEN} (server not started:")
    assert result.skipped[1] == f"skipped: 1 task(s) already_satisfied: {SATISFIED} task 0"
    assert result.summary["episodes"] == 1 and result.summary["outcomes"] == {"others": 1}
    written = json.loads((out / "capture_summary.json").read_text())  # said in the summary file too
    assert written["run"]["scenario_report"] == result.skipped
    report = json.loads((out / "scenario_report.json").read_text())  # the check's report, beside the episodes
    assert sorted(r["scenario"] for r in report["scenarios"]) == [SATISFIED, BROKEN]
    # the check's files beside the episodes are not read as episodes (build-dataset reads this directory)
    episodes, bad = load_awm_episodes([out])
    assert [(t.scenario, t.task_idx) for t in episodes] == [(SATISFIED, 1)] and bad == []

    # kept on request (the report of that run, given by its directory): doing nothing scores "complete"
    kept = collect(
        CollectionSettings(
            output=root / "kept", scenarios=(SATISFIED,), scenario_report=out, include_unusable=True, episodes=1
        ),
        source,
        policy,
    )
    assert kept.tasks == {SATISFIED: [0, 1]}
    assert kept.skipped[0].startswith("kept although the scenario report marks them unusable: 1 task(s)")
    assert kept.summary["verify_only"] == {"episodes": 2, "outcomes": {"complete": 1, "others": 1}}


def test_capture_command_skips_what_the_report_marks_unusable(setup, capsys):
    """`echo-trl capture --scenario_report DIR`: the same screening on the command line, said in the log."""
    from echo_trl.commands.cli import main as cli

    root, source, _ = setup
    report = root / "checked"  # the check the first test ran (module order), or run now
    if not (report / "scenario_report.json").exists():
        collect(CollectionSettings(output=report, scenarios=(SATISFIED, BROKEN), check=True), source, setup[2])
    out = root / "cli"
    argv = ["capture", "--data", str(source.directory), "--scenario", SATISFIED, "--scenario", BROKEN]
    argv += ["--policy", f"replay:{root / 'scripts.jsonl'}", "--output", str(out), "--scenario_report", str(report)]
    assert cli(argv) == 0
    err = capsys.readouterr().err
    assert f"skipped: 1 scenario(s): {BROKEN} (server not started:" in err
    assert f"skipped: 1 task(s) already_satisfied: {SATISFIED} task 0" in err
    assert sorted(p.name for p in out.glob("*.jsonl")) == [f"{SATISFIED}_task1.jsonl"]
