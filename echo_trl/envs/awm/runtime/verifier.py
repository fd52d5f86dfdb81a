"""Run a task's verifier in a short-lived contained subprocess and turn its verdict into a reward.

Code mode (``gen_verifier.pure_code.jsonl``): ``verify_task_completion(initial_db_path,
final_db_path, final_answer=None) -> {"result": "complete" | "others"}``. The verifier reads
*copies* of the initial snapshot and of the final database, made inside its own sandbox from
sealed images, so it can neither change the live episode nor the snapshot.

What comes back is untrusted: the result is read through the host's descriptor, capped at
:data:`MAX_RESULT_BYTES`, and anything that is not a JSON object of sane depth (a list, 100,000
nested brackets, invalid UTF-8) is a ``judge_error`` outcome with the reason; lone surrogates
become U+FFFD, so the episode can always be written. Only the log's tail is ever read.

SQL mode (``gen_verifier.jsonl``): the code returns evidence for an LLM judge, not a verdict.
It runs only with a ``judge`` callable (see :data:`Judge`); without one it is refused with a
clear :class:`VerifierConfigError`.

The rewards per outcome are :class:`~echo_trl.envs.awm.scenario.rewards.RewardConfig`'s.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ....errors import EchoTrlError
from ....sandbox import bwrap, hostio
from ..scenario.database import MAX_IMAGE_BYTES
from ..scenario.source import Scenario, VerifierSpec
from .server import DatabaseUnavailable

VERIFY = str(Path(__file__).with_name("_verify.py"))
MAX_RESULT_BYTES = 1 << 20  # a verdict is a small dict; more is an error, not read
MAX_RESULT_DEPTH = 64
LOG_TAIL_BYTES = 2000
_SURROGATE = re.compile("[\ud800-\udfff]")

#: A database image: its bytes, or the path of a file the host itself wrote.
DatabaseImage = bytes | str | Path

#: judge(task=..., verifier_result=..., raw_response=..., trajectory=...) -> classification
#: ("complete" | "incomplete" | "server_error" | "agent_error").
Judge = Callable[..., str]


class VerifierConfigError(EchoTrlError):
    """A verifier that cannot run as configured (e.g. SQL mode without an LLM judge)."""


class InvalidResult(ValueError):
    """What the verifier process left as its result is not a usable verdict."""


@dataclass
class VerifyOutcome:
    """``reward_type``: complete | others | incomplete | agent_error | server_error | judge_error."""

    reward_type: str
    verify_result: dict[str, Any]
    seconds: float = 0.0
    log: str = field(default="", repr=False)


def run_verifier(
    spec: VerifierSpec,
    initial_db: DatabaseImage,
    final_db: DatabaseImage,
    *,
    final_answer: str | None = None,
    timeout: float = 30.0,
    judge: Judge | None = None,
    task: str = "",
    trajectory: list[dict[str, Any]] | None = None,
    containment: bwrap.Containment | None = None,
) -> VerifyOutcome:
    """Run ``spec`` against copies of ``initial_db`` and ``final_db``; never raises for the verifier's own
    bugs (syntax errors, exceptions, hangs, odd results): those become ``judge_error``."""
    if spec.mode == "sql" and judge is None:
        raise VerifierConfigError(
            f"scenario {spec.scenario!r} task {spec.task_idx}: SQL-mode verifiers return evidence for an LLM "
            "judge, not a verdict; configure a judge (judge=callable) or use the code-mode verifier"
        )
    run = _run(spec, initial_db, final_db, final_answer, timeout, containment)
    return _verdict(spec, run, timeout, judge, task, trajectory)


@dataclass
class _Run:
    """What one verifier process left: its result bytes (or why they were not read), exit, log tail."""

    raw: bytes
    result_error: str
    returncode: int | None
    timed_out: bool
    seconds: float
    log: str


def _run(
    spec: VerifierSpec,
    initial_db: DatabaseImage,
    final_db: DatabaseImage,
    final_answer: str | None,
    timeout: float,
    containment: bwrap.Containment | None,
) -> _Run:
    """One sandboxed verifier process: sealed inputs in, result and log back through the host's memfds."""
    request = {
        "code": spec.code,
        "function": spec.function,
        "filename": f"<verifier {spec.scenario} task {spec.task_idx}>",
        "final_answer": final_answer,
    }
    limits = replace(bwrap.VERIFIER_LIMITS, cpu_seconds=max(1, math.ceil(timeout)) + 1)
    result_fd, log_fd = hostio.output_memfd("result.json"), hostio.output_memfd("verifier.log")
    inputs: list[int] = []
    try:
        for data, name in (
            (json.dumps(request).encode("utf-8", "surrogatepass"), "spec.json"),
            (_image_bytes(initial_db), "initial.db"),
            (_image_bytes(final_db), "final.db"),
        ):
            inputs.append(hostio.sealed_memfd(data, name))
        t0 = time.perf_counter()
        proc = bwrap.spawn(
            [sys.executable, "-I", VERIFY, *map(str, (*inputs, result_fd))],
            readonly=[VERIFY],
            fds=[*inputs, result_fd],
            limits=limits,
            containment=containment,
            stdout=log_fd,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            bwrap.kill_tree(proc)
        seconds = time.perf_counter() - t0
        log = hostio.read_tail(log_fd, LOG_TAIL_BYTES).decode("utf-8", errors="replace")
        try:
            raw, result_error = hostio.read_bounded(result_fd, MAX_RESULT_BYTES, "the verifier's result"), ""
        except (hostio.TooLarge, hostio.NotRegular) as exc:
            raw, result_error = b"", str(exc)
    finally:
        for fd in (*inputs, result_fd, log_fd):
            os.close(fd)
    return _Run(raw, result_error, proc.returncode, timed_out, seconds, log)


def _image_bytes(image: DatabaseImage) -> bytes:
    if isinstance(image, bytes):
        return image
    fd = hostio.open_regular(Path(image))
    try:
        return hostio.read_bounded(fd, MAX_IMAGE_BYTES, str(image))
    finally:
        os.close(fd)


def parse_result(raw: bytes) -> dict[str, Any]:
    """The verifier's result as a JSON object of at most :data:`MAX_RESULT_DEPTH` levels, strings made writable."""
    try:
        out = json.loads(raw.decode("utf-8", errors="replace"))
    except RecursionError:
        raise InvalidResult("the result is nested too deeply to parse") from None
    except ValueError as exc:
        raise InvalidResult(f"the result is not valid JSON ({exc})") from None
    if not isinstance(out, dict):
        raise InvalidResult(f"the result is a JSON {type(out).__name__}, not an object")
    return _clean(out)


def _clean(value: Any) -> Any:
    """Check the depth and replace lone surrogates with U+FFFD, without recursion."""
    root: list[Any] = [value]
    stack: list[tuple[Any, Any, Any, int]] = [(root, 0, value, 1)]  # (container, key, value, depth)
    while stack:
        parent, key, item, depth = stack.pop()
        if depth > MAX_RESULT_DEPTH:
            raise InvalidResult(f"the result is nested more than {MAX_RESULT_DEPTH} levels deep")
        if isinstance(item, str):
            parent[key] = _SURROGATE.sub("\ufffd", item)
        elif isinstance(item, list):
            stack.extend((item, i, v, depth + 1) for i, v in enumerate(item))
        elif isinstance(item, dict):
            fixed = {_SURROGATE.sub("\ufffd", k): v for k, v in item.items()}
            item.clear()
            item.update(fixed)
            stack.extend((item, k, v, depth + 1) for k, v in fixed.items())
    return root[0]


def _error(error_type: Any, message: Any) -> dict[str, Any]:
    return {"execution_status": "error", "error_type": error_type, "error_message": message}


def _failure(run: _Run, timeout: float) -> tuple[dict[str, Any] | None, Any]:
    """Why a finished verifier process gave no verdict (the ``verify_result`` fields saying so; ``None`` when
    it did), and the value it returned."""
    if run.timed_out:
        return {
            "execution_status": "timeout",
            "error_message": f"verifier did not finish within {timeout:g}s (killed)",
        }, None
    if not run.raw and not run.result_error:
        rc = run.returncode
        why = f"killed by signal {-rc}" if rc is not None and rc < 0 else f"exit code {rc}"
        return _error(
            "VerifierCrashed", f"verifier process ended without a result ({why}); log: {run.log[-500:]}"
        ), None
    try:
        if run.result_error:
            raise InvalidResult(run.result_error)
        out = parse_result(run.raw)
    except InvalidResult as exc:
        return _error("InvalidResult", str(exc)), None
    if out.get("status") != "ok":
        return _error(out.get("error_type"), out.get("error_message")), None
    return None, out.get("value")


def _verdict(
    spec: VerifierSpec,
    run: _Run,
    timeout: float,
    judge: Judge | None,
    task: str,
    trajectory: list[dict[str, Any]] | None,
) -> VerifyOutcome:
    """The outcome of a finished verifier process: every odd result is one ``judge_error`` with the reason."""
    base = {"verifier_mode": spec.mode, "verifier": spec.source}
    failure, value = _failure(run, timeout)
    if failure is None and spec.mode != "sql" and (not isinstance(value, dict) or "result" not in value):
        why = f"expected a dict with 'result', got {type(value).__name__}"
        failure = {**_error("InvalidReturn", why), "raw_result": value}
    if failure is not None:
        return VerifyOutcome("judge_error", {**base, "result": "others", **failure}, run.seconds, run.log)
    if spec.mode == "sql":  # evidence for the judge, which classifies it
        raw = judge(task=task, verifier_result=value, raw_response=spec.raw_response, trajectory=trajectory or [])
        result = str(raw).strip().lower()
        if result not in ("complete", "incomplete", "server_error", "agent_error"):
            result = "judge_error"
        verify_result = {**base, "execution_status": "success", "raw_result": value, "result": result}
    else:
        result = value["result"] if value["result"] in ("complete", "others") else "others"
        verify_result = {**base, "result": result, "execution_status": "success", "raw_result": value}
    return VerifyOutcome(result, verify_result, run.seconds, run.log)


def verify_databases(
    scenario: Scenario,
    task_idx: int | None,
    initial_db: bytes,
    final_db: bytes | Callable[[], bytes],
    *,
    verifier_mode: str,
    timeout: float,
    judge: Judge | None,
    containment: bwrap.Containment | None,
    final_answer: str | None = None,
    task: str = "",
    trajectory: list[dict[str, Any]] | None = None,
) -> VerifyOutcome:
    """Run the task's verifier on ``final_db`` against ``initial_db`` (no verifier -> ``no_verifier``).

    Used by the runtime (``final_db``: the server's live database) and by a pooled session (its
    own database copy, no server needed). ``final_db`` may be a callable, asked only when a verifier
    runs; a database it cannot deliver is a ``server_error`` outcome.
    """
    spec = scenario.verifier(task_idx, verifier_mode) if task_idx is not None else None
    if spec is None:
        return VerifyOutcome(
            "no_verifier",
            {
                "verifier_mode": verifier_mode,
                "result": "others",
                "execution_status": "error",
                "error_message": f"no {verifier_mode} verifier for task {task_idx} of scenario {scenario.name!r}",
            },
        )
    if callable(final_db):
        try:
            final_db = final_db()
        except DatabaseUnavailable as exc:
            return VerifyOutcome(
                "server_error",
                {
                    "verifier_mode": verifier_mode,
                    "verifier": spec.source,
                    "result": "others",
                    "execution_status": "error",
                    "error_type": "DatabaseUnavailable",
                    "error_message": f"the final database could not be read from the scenario server: {exc}",
                },
            )
    return run_verifier(
        spec,
        initial_db,
        final_db,
        final_answer=final_answer,
        timeout=timeout,
        judge=judge,
        task=task,
        trajectory=trajectory,
        containment=containment,
    )
