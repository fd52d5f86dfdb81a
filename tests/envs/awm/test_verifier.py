"""Verifiers in sandboxed subprocesses: real e_commerce_33 verifiers, broken ones, hanging ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.processes import descendant_pids

from echo_trl.envs.awm import sandbox
from echo_trl.envs.awm.database import build_database, copy_database
from echo_trl.envs.awm.scenario import ScenarioSource, VerifierSpec
from echo_trl.envs.awm.verifier import RewardConfig, VerifierConfigError, run_verifier

SAMPLES = Path(__file__).resolve().parents[4] / "shared" / "data" / "awm1k_samples"


@pytest.fixture(scope="module")
def ecommerce(tmp_path_factory):
    if not SAMPLES.is_dir():
        pytest.skip(f"shared AWM-1K samples not found at {SAMPLES} (they live in ../shared/data, not in the repo)")
    sc = ScenarioSource.from_dir(SAMPLES).load("e_commerce_33")
    d = tmp_path_factory.mktemp("ecommerce")
    os.chmod(d, 0o755)
    build_database(sc, d / "initial.db")
    copy_database(d / "initial.db", d / "final.db")
    return sc, d


def _work(tmp_path: Path, name: str) -> Path:
    w = tmp_path / name
    w.mkdir()
    os.chmod(tmp_path, 0o755)
    return w


def test_ecommerce_code_verifiers_run_on_built_databases(ecommerce, tmp_path):
    sc, d = ecommerce
    outcomes = {
        k: run_verifier(sc.verifier(k, "code"), d / "initial.db", d / "final.db", _work(tmp_path, f"w{k}"), timeout=30)
        for k in range(3)
    }
    for k, o in outcomes.items():
        assert o.verify_result["execution_status"] == "success", (k, o.verify_result, o.log)
        assert o.reward_type == "others"  # nothing was done in the database
    # Task 0's verifier is defective (data README): it returns "others" for every database.
    assert outcomes[0].verify_result["raw_result"] == {"result": "others"}
    assert RewardConfig().reward(outcomes[0].reward_type) == 0.0


def test_syntax_error_verifier_is_a_clear_verifier_error(ecommerce, tmp_path):
    sc, d = ecommerce
    spec = sc.verifier(2, "sql")  # gen_verifier.jsonl line 3: a SyntaxError in the source data
    assert spec.source == "gen_verifier.jsonl:3"
    with pytest.raises(VerifierConfigError, match="SQL-mode verifiers return evidence for an LLM judge"):
        run_verifier(spec, d / "initial.db", d / "final.db", _work(tmp_path, "nojudge"))
    calls = []
    out = run_verifier(
        spec,
        d / "initial.db",
        d / "final.db",
        _work(tmp_path, "judge"),
        judge=lambda **kw: calls.append(kw) or "complete",
    )
    assert out.reward_type == "judge_error" and not calls
    assert out.verify_result["error_type"] == "SyntaxError"
    assert out.verify_result["error_message"].startswith("line 174:")


def test_sql_verifier_with_a_judge(ecommerce, tmp_path):
    sc, d = ecommerce
    seen = {}
    out = run_verifier(
        sc.verifier(1, "sql"),
        d / "initial.db",
        d / "final.db",
        _work(tmp_path, "w"),
        judge=lambda **kw: seen.update(kw) or "incomplete",
        task=sc.task(1),
    )
    assert out.reward_type == "incomplete" and RewardConfig().reward("incomplete") == 0.1
    assert seen["task"] == sc.task(1) and isinstance(seen["verifier_result"], dict)


def _spec(code: str, fn: str = "verify_task_completion") -> VerifierSpec:
    return VerifierSpec("synthetic", 0, "code", code, fn, "test")


def test_complete_exception_and_bad_return(ecommerce, tmp_path):
    _, d = ecommerce
    ok = run_verifier(
        _spec(
            "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
            "    import sqlite3\n"
            "    n = sqlite3.connect(final_db_path).execute('select count(*) from users').fetchone()[0]\n"
            "    return {'result': 'complete' if n == 3 and final_answer == 'yes' else 'others'}\n"
        ),
        d / "initial.db",
        d / "final.db",
        _work(tmp_path, "a"),
        final_answer="yes",
    )
    assert ok.reward_type == "complete" and RewardConfig().reward(ok.reward_type) == 1.0
    boom = run_verifier(
        _spec("def verify_task_completion(a, b):\n    raise KeyError('x')\n"),
        d / "initial.db",
        d / "final.db",
        _work(tmp_path, "b"),
    )
    assert boom.reward_type == "judge_error" and boom.verify_result["error_type"] == "KeyError"
    assert boom.verify_result["error_message"].startswith("line 2:")
    bad = run_verifier(
        _spec("def verify_task_completion(a, b):\n    return 'complete'\n"),
        d / "initial.db",
        d / "final.db",
        _work(tmp_path, "c"),
    )
    assert bad.reward_type == "judge_error" and bad.verify_result["error_type"] == "InvalidReturn"


def test_hanging_verifier_is_killed_with_its_children(ecommerce, tmp_path):
    _, d = ecommerce
    before = descendant_pids()
    code = (
        "def verify_task_completion(a, b):\n    import subprocess, time\n"
        "    subprocess.Popen(['sleep', '300'])\n    while True:\n        time.sleep(1)\n"
    )
    out = run_verifier(_spec(code), d / "initial.db", d / "final.db", _work(tmp_path, "hang"), timeout=2)
    assert out.reward_type == "judge_error" and out.verify_result["execution_status"] == "timeout"
    assert "did not finish within 2s" in out.verify_result["error_message"]
    after = descendant_pids()
    assert after <= before and not sandbox.live_children()
    assert not _processes_in(tmp_path)  # the verifier's own child (sleep) died with it


def _processes_in(directory: Path) -> list[int]:
    """PIDs whose working directory is inside ``directory``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.readlink(d / "cwd").startswith(str(directory)):
                    found.append(int(d.name))
            except OSError:
                pass
    return found
