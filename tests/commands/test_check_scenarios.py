"""`echo-trl check-scenarios`: the report, its reuse on a rerun, the flags and the one-line errors.

The scenario checked here has no server code (tests/helpers/awm_defects.py: ``serverless_scenario``), so these
runs build its database and run its two verifiers but start no server; the server checks are tested in
tests/envs/awm/check/test_scenario_check.py.
"""

from __future__ import annotations

import json

import pytest
from helpers.awm_defects import ALREADY_SATISFIED, REPO, serverless_scenario, write_scenarios

from echo_trl.commands.cli import main as cli
from echo_trl.envs.awm.check.report import comparable


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_scenarios(tmp_path_factory.mktemp("serverless") / "data", serverless_scenario())


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = cli(["check-scenarios", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.sandbox  # the verifiers run contained
def test_table_report_and_rerun(data, tmp_path, capsys):
    code, out, err = _run(capsys, data, "--output", tmp_path / "check")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split()[:2] == ["library_no_server", "unusable"]
    assert "library_no_server: UNUSABLE: server not started: no server code: no record in gen_envs.jsonl" in out
    assert "library_no_server task 0: already_satisfied: the verifier returns 'complete'" in out
    assert "1 already_satisfied" in lines[1] and "1 ok" in lines[1]
    first = json.loads((tmp_path / "check" / "scenario_report.json").read_text())
    assert first["run"]["checked"] == 1
    stored = (tmp_path / "check" / "scenario_check.jsonl").read_text().splitlines()
    assert [json.loads(line)["scenario"] for line in stored] == ["library_no_server"]

    code, out, _ = _run(capsys, data, "--output", tmp_path / "check", "--json")
    again = json.loads(out)  # stdout is the one JSON object
    assert code == 0 and again["run"]["checked"] == 0 and again["run"]["reused"] == 1
    assert comparable(again) == comparable(first)


@pytest.mark.sandbox  # the verifiers run contained
def test_changed_data_is_checked_again(data, tmp_path, capsys):
    assert _run(capsys, data, "--output", tmp_path / "check")[0] == 0
    changed = serverless_scenario()
    (verifier,) = [r for r in changed["library_no_server"]["gen_verifier.pure_code.jsonl"] if r["task_idx"] == 0]
    verifier["verification"]["code"] = ALREADY_SATISFIED.replace("members > 0", "members > 10000")
    write_scenarios(data.parent / "changed", changed)
    code, out, err = _run(capsys, data.parent / "changed", "--output", tmp_path / "check", "--json")
    report = json.loads(out)
    assert code == 0 and report["run"]["checked"] == 1
    assert report["scenarios"][0]["tasks"][0]["outcome"] == "ok"


@pytest.mark.sandbox  # the verifiers run contained
def test_config_file_and_scenario_flag(data, tmp_path, capsys):
    config = tmp_path / "check.yaml"
    config.write_text(f"output: {tmp_path / 'from_config'}\nscenario: [library_no_server]\nverifier_timeout: 20\n")
    code, _, err = _run(capsys, data, "--config", config)
    assert code == 0, err
    report = json.loads((tmp_path / "from_config" / "scenario_report.json").read_text())
    assert report["settings"]["verifier_timeout"] == 20.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{missing}"], "DATA {missing}: no such file or directory"),
        (["{data}", "--scenario", "no_such_scenario"], "scenario 'no_such_scenario': not found in"),
        (["{data}", "--concurrency", "0"], "argument --concurrency: expected a positive integer"),
        (["{data}", "--verifier_timeout", "nan"], "argument --verifier_timeout: expected a finite number > 0"),
        (["{empty}"], "no AWM gen_*.jsonl files in"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(data, tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    values = {"data": data, "missing": tmp_path / "missing", "empty": tmp_path / "empty"}
    argv = [a.format(**values) for a in argv]
    code = None
    try:
        code, _, err = _run(capsys, *argv, "--output", tmp_path / "check")
    except SystemExit as exc:  # usage errors: argparse's exit
        code, err = exc.code, capsys.readouterr().err
    assert code == 2
    assert message.format(**values) in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.sandbox  # the verifiers run contained
def test_a_rerun_with_other_settings_is_refused(data, tmp_path, capsys):
    assert _run(capsys, data, "--output", tmp_path / "check")[0] == 0
    code, _, err = _run(capsys, data, "--output", tmp_path / "check", "--verifier_timeout", "5")
    assert code == 2 and "verifier_timeout=30.0, this run asks 5.0" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--check", "--scenario_report", "{report}"], "--scenario-report and --check contradict each other"),
        (["--include_unusable"], "--include-unusable needs --scenario-report PATH or --check"),
        (["--scenario_report", "{garbage}"], "{garbage}: not a readable JSON report"),
        (["--scenario_report", "{missing}"], "{missing}/scenario_report.json: no such file"),
        (["--scenario_report", "{report}"], "has no result for scenario 'library_1' (it covers 0)"),
    ],
)
def test_capture_screening_flags_refuse_in_one_line(tmp_path, capsys, flags, message):
    """capture's --scenario_report / --check / --include_unusable: a bad combination or report is one line, exit 2,
    before any server starts."""
    from echo_trl.envs.awm.check.report import CHECK_VERSION, REPORT_KIND

    values = {"report": tmp_path / "r.json", "garbage": tmp_path / "g.json", "missing": tmp_path / "nothing"}
    values["missing"].mkdir()
    values["report"].write_text(json.dumps({"report": REPORT_KIND, "version": CHECK_VERSION, "scenarios": []}))
    values["garbage"].write_text("{not json")
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"scenario": "library_1", "task_idx": 0, "calls": []}) + "\n")
    argv = ["capture", "--data", str(REPO / "data" / "awm_scenarios"), "--scenario", "library_1"]
    argv += ["--policy", f"replay:{script}", "--output", str(tmp_path / "out"), *(f.format(**values) for f in flags)]
    try:
        code, err = cli(argv), capsys.readouterr().err
    except SystemExit as exc:  # usage errors: argparse's exit
        code, err = exc.code, capsys.readouterr().err
    assert code == 2 and message.format(**values) in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("*.jsonl"))


@pytest.mark.sandbox  # the verifiers run contained
def test_a_hub_dataset_id_is_read_through_the_hf_cache(data, tmp_path, capsys, monkeypatch):
    """DATA as a Hub dataset id: the files come through huggingface_hub's cache (offline here), as capture --hub
    reads them, and the report names the Hub dataset as its source."""
    import os

    import huggingface_hub.constants as hc

    from echo_trl.envs.awm.scenario.source import FILES

    repo = "someone/awm-copy"
    commit = "0123456789abcdef0123456789abcdef01234567"
    cache = tmp_path / "hub"
    snap = cache / ("datasets--" + repo.replace("/", "--")) / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text(commit)
    for f in data.glob("gen_*.jsonl"):
        os.symlink(f, snap / f.name)
    # offline, a file the cache lacks may or may not be on the Hub: the dataset's repository has every file
    for name in FILES.values():
        if not (snap / name).exists():
            (snap / name).write_text("")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # "someone/awm-copy" is no local path here
    code, out, err = _run(capsys, repo, "--output", tmp_path / "check", "--json")
    assert code == 0, err
    report = json.loads(out)
    local = json.loads(_run(capsys, data, "--output", tmp_path / "local", "--json")[1])
    assert report["source"] == f"hf://datasets/{repo}"
    assert comparable(report)["scenarios"] == comparable(local)["scenarios"]  # the same files, the same findings
