"""The conformance runner's own pieces (benchmarks/conformance/trl_sft_conformance.py, trl_sft_standins.py):
reading outcomes from a ``pytest -v`` log, and stand-ins built once, reused, and rebuilt when their sizes change."""

from __future__ import annotations

import json

import pytest
from helpers.bench import importable_benchmarks

importable_benchmarks()

LOG = """\
============================= test session starts ==============================
collecting ... collected 5 items

tests/test_sft_trainer.py::TestDFTLoss::test_dft_loss FAILED             [ 20%]
tests/test_sft_trainer.py::TestSFTTrainer::test_train[./trl-internal-testing/tiny-Qwen2ForCausalLM-2.5] PASSED [ 40%]
tests/test_sft_trainer.py::TestSFTTrainer::test_teardown PASSED          [ 60%]
tests/test_sft_trainer.py::TestSFTTrainer::test_teardown ERROR           [ 60%]
tests/test_sft_trainer.py::TestSFTTrainerSlow::test_gpu SKIPPED (needs a GPU) [ 80%]
tests/test_sft_trainer.py::TestSFTTrainer::test_still_running
"""


def test_outcomes_from_a_verbose_log(tmp_path):
    from trl_sft_conformance import outcomes_from_log

    (tmp_path / "echo.log").write_text(LOG)
    assert outcomes_from_log(tmp_path / "echo.log") == {
        "TestDFTLoss::test_dft_loss": "failed",
        "TestSFTTrainer::test_train[./trl-internal-testing/tiny-Qwen2ForCausalLM-2.5]": "passed",
        "TestSFTTrainer::test_teardown": "failed",  # passed, then errored in teardown
        "TestSFTTrainerSlow::test_gpu": "skipped",
    }  # the test still running when the log was read has no outcome


def test_from_logs_compares_on_the_tests_every_trainer_finished(tmp_path, capsys):
    from trl_sft_conformance import main

    line = "tests/test_sft_trainer.py::T::{} {}\n"
    (tmp_path / "trl.log").write_text(
        line.format("a", "PASSED") + line.format("b", "PASSED") + line.format("c", "PASSED")
    )
    (tmp_path / "echo.log").write_text(line.format("a", "PASSED") + line.format("b", "FAILED"))
    assert main(["--from_logs", str(tmp_path), "--trainers", "trl", "echo", "--json"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[-1]) == {
        "trl": {"T::a": "passed", "T::b": "passed"},
        "echo": {"T::a": "passed", "T::b": "failed"},
    }
    assert "  lost: T::b" in out


@pytest.mark.slow
def test_standins_are_reused_and_rebuilt_when_their_sizes_change(tmp_path, monkeypatch):
    import trl_sft_standins as s

    name = "tiny-NemotronHForCausalLM-nano"
    assert s.build_model(tmp_path, name) is None
    config = tmp_path / s.ORG / name / "config.json"
    built = json.loads(config.read_text())
    for key, value in s.EXTRA[name].items():
        assert built[key] == value
    first = config.stat().st_mtime_ns
    assert s.build_model(tmp_path, name) is None
    assert config.stat().st_mtime_ns == first  # reused
    monkeypatch.setitem(s.EXTRA, name, {**s.EXTRA[name], "ssm_state_size": 8})
    assert s.build_model(tmp_path, name) is None
    assert json.loads(config.read_text())["ssm_state_size"] == 8  # rebuilt
