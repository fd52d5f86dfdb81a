"""Verifiers in sandboxed subprocesses: real e_commerce_33 verifiers, broken ones, hanging ones."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from helpers.processes import descendant_pids

from echo_trl.envs.awm.runtime.verifier import VerifierConfigError, run_verifier
from echo_trl.envs.awm.scenario.database import build_database, copy_database
from echo_trl.envs.awm.scenario.rewards import RewardConfig
from echo_trl.envs.awm.scenario.source import ScenarioSource, VerifierSpec
from echo_trl.sandbox import bwrap as sandbox

SAMPLES = Path(__file__).resolve().parents[5] / "shared" / "data" / "awm1k_samples"


@pytest.fixture(scope="module")
def ecommerce(tmp_path_factory):
    if not SAMPLES.is_dir():
        pytest.skip(f"shared AWM-1K samples not found at {SAMPLES} (they live in ../shared/data, not in the repo)")
    sc = ScenarioSource.from_dir(SAMPLES).load("e_commerce_33")
    d = tmp_path_factory.mktemp("ecommerce")
    build_database(sc, d / "initial.db")
    copy_database(d / "initial.db", d / "final.db")
    return sc, d


def test_ecommerce_code_verifiers_run_on_built_databases(ecommerce, tmp_path):
    sc, d = ecommerce
    outcomes = {
        k: run_verifier(sc.verifier(k, "code"), d / "initial.db", d / "final.db", timeout=30) for k in range(3)
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
        run_verifier(spec, d / "initial.db", d / "final.db")
    calls = []
    out = run_verifier(
        spec,
        d / "initial.db",
        d / "final.db",
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
        final_answer="yes",
    )
    assert ok.reward_type == "complete" and RewardConfig().reward(ok.reward_type) == 1.0
    boom = run_verifier(
        _spec("def verify_task_completion(a, b):\n    raise KeyError('x')\n"),
        d / "initial.db",
        d / "final.db",
    )
    assert boom.reward_type == "judge_error" and boom.verify_result["error_type"] == "KeyError"
    assert boom.verify_result["error_message"].startswith("line 2:")
    bad = run_verifier(
        _spec("def verify_task_completion(a, b):\n    return 'complete'\n"),
        d / "initial.db",
        d / "final.db",
    )
    assert bad.reward_type == "judge_error" and bad.verify_result["error_type"] == "InvalidReturn"


def test_hanging_verifier_is_killed_with_its_children(ecommerce, tmp_path):
    _, d = ecommerce
    before = descendant_pids()
    marker = f"echo_trl_verifier_child_{os.getpid()}_{id(tmp_path)}"
    code = (
        "def verify_task_completion(a, b):\n    import subprocess, time\n"
        f"    subprocess.Popen(['sleep', '300', '{marker}'])\n    while True:\n        time.sleep(1)\n"
    )
    out = run_verifier(_spec(code), d / "initial.db", d / "final.db", timeout=2)
    assert out.reward_type == "judge_error" and out.verify_result["execution_status"] == "timeout"
    assert "did not finish within 2s" in out.verify_result["error_message"]
    after = descendant_pids()
    assert after <= before and not sandbox.live_children()
    assert not _processes_with(marker)  # the verifier's own child (sleep) died with it


def _processes_with(marker: str) -> list[int]:
    """PIDs whose command line holds ``marker``."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


# --------------------------------------------------------------------------------------------
# What the verifier process leaves is untrusted: odd results are verifier errors, never crashes.

LIBRARY = Path(__file__).resolve().parents[4] / "data" / "awm_scenarios"

# The verifier's code writes RESULT itself and exits before the bootstrap would: RESULT is the last
# argument of the bootstrap (a descriptor the host passed, or, in older layouts, a path).
WRITE_RESULT = """
def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import os, sys
    target, data = sys.argv[-1], {data!r}
    if target.isdigit():
        os.write(int(target), data)
    else:
        with open(target, "wb") as fh:
            fh.write(data)
    os._exit(0)
"""


@pytest.fixture(scope="module")
def library_dbs(tmp_path_factory):
    sc = ScenarioSource.from_dir(LIBRARY).load("library_1")
    d = tmp_path_factory.mktemp("library")
    build_database(sc, d / "initial.db")
    copy_database(d / "initial.db", d / "final.db")
    return d / "initial.db", d / "final.db"


def _writable(verify_result: dict) -> str:
    """The verify_result as the capture writes it (UTF-8 JSON): must not raise."""
    return json.dumps(verify_result, ensure_ascii=False).encode("utf-8").decode("utf-8")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"[1, 2, 3]", "a JSON list, not an object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"status": "ok", "value": ' + b'{"a": ' * 70 + b"1" + b"}" * 70 + b"}", "nested more than 64 levels"),
        (b"\xff\xfe not json", "not valid JSON"),
        (b'{"status": "ok", "value": {"result": "others", "x": "' + b"y" * (2 << 20) + b'"}}', "over the"),
    ],
    ids=["list", "deep_100k", "deep_70", "binary", "over_cap"],
)
def test_odd_verifier_results_are_verifier_errors(library_dbs, data, reason):
    initial, final = library_dbs
    out = run_verifier(_spec(WRITE_RESULT.format(data=data)), initial, final, timeout=30)
    assert out.reward_type == "judge_error", out.verify_result
    assert out.verify_result["error_type"] == "InvalidResult" and reason in out.verify_result["error_message"]
    assert len(_writable(out.verify_result)) < 10_000


def test_lone_surrogates_in_a_result_become_replacement_characters(library_dbs):
    initial, final = library_dbs
    data = b'{"status": "ok", "value": {"result": "complete", "note": "a\\ud800b", "\\udfff": 1}}'
    out = run_verifier(_spec(WRITE_RESULT.format(data=data)), initial, final, timeout=30)
    assert out.reward_type == "complete"
    assert out.verify_result["raw_result"] == {"result": "complete", "note": "a\ufffdb", "\ufffd": 1}
    assert "\ufffd" in _writable(out.verify_result)


def test_the_verifier_cannot_make_the_host_read_a_file_or_block_on_a_fifo(library_dbs, tmp_path):
    """Where the host used to read the log and the result by path, the verifier put a link to a root-only
    file and a FIFO: the host must neither follow the link nor block (it reads its own descriptors)."""
    initial, final = library_dbs
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-verifier-log")
    os.chmod(secret, 0o600)
    code = f"""
def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    import os, sys
    for name in ("verifier.log", "result.json"):
        for where in (os.getcwd(), os.path.dirname(sys.argv[-1])):
            path = os.path.join(where or ".", name)
            try:
                os.unlink(path)
            except OSError:
                pass
            try:
                os.symlink({str(secret)!r}, path) if name == "verifier.log" else os.mkfifo(path)
            except OSError:
                pass
    os._exit(3)
"""
    result: list = []
    worker = threading.Thread(
        target=lambda: result.append(run_verifier(_spec(code), initial, final, timeout=30)), daemon=True
    )
    worker.start()
    worker.join(60)
    assert result, "run_verifier blocked on what the verifier left"
    (out,) = result
    assert out.reward_type == "judge_error" and out.verify_result["error_type"] == "VerifierCrashed"
    assert "exit code 3" in out.verify_result["error_message"]
    assert "TOP-SECRET" not in _writable(out.verify_result) and "TOP-SECRET" not in out.log
