"""Online training leaves out what a scenario report marks unusable: the prompts, the factories, the reset guard.

The report is a real check (``check_scenarios``) of two generated scenarios (tests/helpers/awm_defects.py): one
whose server does not start, one whose task 0 is already satisfied by the untouched database.
"""

from __future__ import annotations

import logging

import pytest
from helpers.awm_defects import SERVER_ERROR, defective_scenarios, write_scenarios

from echo_trl.envs.awm.check.run import CheckSettings, check_scenarios
from echo_trl.envs.awm.check.usable import ReportError
from echo_trl.envs.awm.online.dataset import awm_task_dataset
from echo_trl.envs.awm.online.environment import awm_environment_factories, awm_environment_factory
from echo_trl.envs.awm.runtime.pool import ServerPool
from echo_trl.envs.awm.scenario.source import ScenarioError, ScenarioSource

SATISFIED, BROKEN = "library_already_satisfied", "library_server_fails"

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]  # starts contained scenario servers and verifier processes


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    defects = defective_scenarios()
    source = ScenarioSource.from_dir(write_scenarios(root / "data", {n: defects[n] for n in (SATISFIED, BROKEN)}))
    check_scenarios(source, CheckSettings(output=root / "check", concurrency=2))
    return source.load(SATISFIED), source.load(BROKEN), root / "check"  # the report: by its directory


def test_the_prompts_leave_out_unusable_scenarios_and_tasks(checked, caplog):
    satisfied, broken, report = checked
    with caplog.at_level(logging.WARNING):
        ds = awm_task_dataset([satisfied, broken], scenario_report=report)
    assert list(zip(ds["scenario"], ds["task_idx"], strict=True)) == [(SATISFIED, 1)]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert f"skipped: 1 scenario(s): {BROKEN} (server not started:" in warning and SERVER_ERROR in warning
    assert f"skipped: 1 task(s) already_satisfied: {SATISFIED} task 0" in warning
    everything = awm_task_dataset([satisfied, broken], scenario_report=report, include_unusable=True)
    assert len(everything) == 4
    with pytest.raises(ReportError, match="marks every task asked for unusable"):
        awm_task_dataset(satisfied, [0], scenario_report=report)


def test_factories_leave_out_unusable_scenarios_and_refuse_unusable_tasks(checked, caplog):
    satisfied, broken, report = checked
    with ServerPool(1) as pool:
        with caplog.at_level(logging.WARNING):
            factories = awm_environment_factories([satisfied, broken], pool=pool, scenario_report=report)
        assert list(factories) == [SATISFIED]  # the broken server was never started (it would raise)
        assert f"left out 1 scenario(s) the scenario report marks unusable: {BROKEN}" in caplog.text
        env = factories[SATISFIED]()
        with pytest.raises(ValueError, match=f"task 0 of scenario '{SATISFIED}' is unusable .*already_satisfied"):
            env.reset(task_idx=0, scenario=SATISFIED)
        env.reset(task_idx=1, scenario=SATISFIED)
        assert env.get_reward() == 0.0  # task 1: doing nothing does not pass
        # kept on request: doing nothing scores "complete", the reason it is left out by default
        kept = awm_environment_factory(satisfied, pool=pool, scenario_report=report, include_unusable=True)()
        kept.reset(task_idx=0)
        assert kept.get_reward() == 1.0
        with pytest.raises(ScenarioError, match="marks it .* unusable"):
            awm_environment_factory(broken, pool=pool, scenario_report=report)


def test_the_online_example_checks_first_and_leaves_out_what_is_unusable(checked, tmp_path, capsys):
    """examples/train_online_awm.py --awm_check: the check runs into the output directory before any model is
    loaded, and task 0 of both scenarios (an unstartable server, an already satisfied task) is left out: nothing is
    left to train on, which is refused in one line after saying what was skipped and why."""
    import importlib.util
    import sys

    from helpers.awm_defects import REPO

    from echo_trl.errors import EchoTrlError

    report = checked[2]  # the fixture's data lies beside its check
    spec = importlib.util.spec_from_file_location("train_online_awm", REPO / "examples" / "train_online_awm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    argv = ["--model_name_or_path", str(tmp_path / "no_model_needed"), "--output_dir", str(tmp_path / "out")]
    argv += ["--use_cpu", "true", "--bf16", "false", "--report_to", "none"]
    argv += ["--awm_data", str(report.parent / "data"), "--awm_scenario", SATISFIED, BROKEN, "--awm_tasks", "0"]
    with pytest.raises(EchoTrlError, match="marks every scenario and task asked for unusable"):
        module.main([*argv, "--awm_check"])
    err = capsys.readouterr().err
    assert f"scenario report: skipped: 1 scenario(s): {BROKEN} (server not started:" in err
    assert f"scenario report: skipped: 1 task(s) already_satisfied: {SATISFIED} task 0" in err
    assert (tmp_path / "out" / "scenario_check" / "0" / "scenario_report.json").is_file()
