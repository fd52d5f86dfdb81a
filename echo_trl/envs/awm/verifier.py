"""Run a task's verifier in a short-lived contained subprocess and turn its verdict into a reward.

Code mode (``gen_verifier.pure_code.jsonl``): ``verify_task_completion(initial_db_path,
final_db_path, final_answer=None) -> {"result": "complete" | "others"}``. The verifier reads
*copies* of the initial snapshot and of the final database (taken with the backup API), so it
can neither change the live episode nor the snapshot.

SQL mode (``gen_verifier.jsonl``): the code returns evidence for an LLM judge, not a verdict.
It runs only with a ``judge`` callable (see :data:`Judge`); without one it is refused with a
clear :class:`VerifierConfigError`.

Reward defaults follow AWM: complete 1.0, incomplete 0.1, format error -1.0, anything else 0.0.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import EchoTrlError
from . import sandbox
from .database import copy_database
from .scenario import VerifierSpec

VERIFY = str(Path(__file__).with_name("_verify.py"))

#: judge(task=..., verifier_result=..., raw_response=..., trajectory=...) -> classification
#: ("complete" | "incomplete" | "server_error" | "agent_error").
Judge = Callable[..., str]


class VerifierConfigError(EchoTrlError):
    """A verifier that cannot run as configured (e.g. SQL mode without an LLM judge)."""


@dataclass(frozen=True)
class RewardConfig:
    """Episode reward per outcome (AWM defaults)."""

    complete: float = 1.0
    incomplete: float = 0.1
    format_error: float = -1.0
    other: float = 0.0

    def reward(self, reward_type: str) -> float:
        if reward_type in ("tool_not_found", "invalid_args", "format_error"):
            return self.format_error
        return {"complete": self.complete, "incomplete": self.incomplete}.get(reward_type, self.other)


@dataclass
class VerifyOutcome:
    """``reward_type``: complete | others | incomplete | agent_error | server_error | judge_error."""

    reward_type: str
    verify_result: dict[str, Any]
    seconds: float = 0.0
    log: str = field(default="", repr=False)


def run_verifier(
    spec: VerifierSpec,
    initial_db: str | Path,
    live_db: str | Path,
    work_dir: str | Path,
    *,
    final_answer: str | None = None,
    timeout: float = 30.0,
    judge: Judge | None = None,
    task: str = "",
    trajectory: list[dict[str, Any]] | None = None,
    containment: sandbox.Containment | None = None,
) -> VerifyOutcome:
    """Run ``spec`` against copies of ``initial_db`` and ``live_db`` in ``work_dir``; never raises for
    the verifier's own bugs (syntax errors, exceptions, hangs): those become ``judge_error``."""
    if spec.mode == "sql" and judge is None:
        raise VerifierConfigError(
            f"scenario {spec.scenario!r} task {spec.task_idx}: SQL-mode verifiers return evidence for an LLM "
            "judge, not a verdict; configure a judge (judge=callable) or use the code-mode verifier"
        )
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    initial, final = work / "initial.db", work / "final.db"
    copy_database(initial_db, initial)
    copy_database(live_db, final)
    spec_file, result_file = work / "spec.json", work / "result.json"
    spec_file.write_text(
        json.dumps(
            {
                "code": spec.code,
                "function": spec.function,
                "filename": f"<verifier {spec.scenario} task {spec.task_idx}>",
                "initial_db_path": str(initial.resolve()),
                "final_db_path": str(final.resolve()),
                "final_answer": final_answer,
            }
        ),
        encoding="utf-8",
    )
    limits = replace(sandbox.VERIFIER_LIMITS, cpu_seconds=max(1, math.ceil(timeout)) + 1)
    log_path = work / "verifier.log"
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = sandbox.spawn(
            [sys.executable, "-I", VERIFY, str(spec_file), str(result_file)],
            cwd=str(work),
            writable=[str(work)],
            readonly=[VERIFY],
            limits=limits,
            containment=containment,
            stdout=log,
        )
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        sandbox.kill_tree(proc)
    seconds = time.perf_counter() - t0
    log_text = log_path.read_bytes()[-2000:].decode("utf-8", errors="replace") if log_path.exists() else ""
    base = {"verifier_mode": spec.mode, "verifier": spec.source}
    if timed_out:
        return VerifyOutcome(
            "judge_error",
            {
                **base,
                "result": "others",
                "execution_status": "timeout",
                "error_message": f"verifier did not finish within {timeout:g}s (killed)",
            },
            seconds,
            log_text,
        )
    try:
        out = json.loads(result_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        rc = proc.returncode
        why = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exit code {rc}"
        return VerifyOutcome(
            "judge_error",
            {
                **base,
                "result": "others",
                "execution_status": "error",
                "error_type": "VerifierCrashed",
                "error_message": f"verifier process ended without a result ({why}); log: {log_text[-500:]}",
            },
            seconds,
            log_text,
        )
    if out.get("status") != "ok":
        return VerifyOutcome(
            "judge_error",
            {
                **base,
                "result": "others",
                "execution_status": "error",
                "error_type": out.get("error_type"),
                "error_message": out.get("error_message"),
            },
            seconds,
            log_text,
        )
    value = out.get("value")
    if spec.mode == "sql":
        classification = (
            str(judge(task=task, verifier_result=value, raw_response=spec.raw_response, trajectory=trajectory or []))
            .strip()
            .lower()
        )
        if classification not in ("complete", "incomplete", "server_error", "agent_error"):
            classification = "judge_error"
        return VerifyOutcome(
            classification,
            {**base, "execution_status": "success", "raw_result": value, "result": classification},
            seconds,
            log_text,
        )
    if not isinstance(value, dict) or "result" not in value:
        return VerifyOutcome(
            "judge_error",
            {
                **base,
                "result": "others",
                "execution_status": "error",
                "error_type": "InvalidReturn",
                "error_message": f"expected a dict with 'result', got {type(value).__name__}",
                "raw_result": value,
            },
            seconds,
            log_text,
        )
    result = value.get("result") if value.get("result") in ("complete", "others") else "others"
    return VerifyOutcome(
        result, {**base, "result": result, "execution_status": "success", "raw_result": value}, seconds, log_text
    )
