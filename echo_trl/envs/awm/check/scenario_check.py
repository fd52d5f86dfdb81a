"""Check one AWM scenario: database built, server started, tools listed, verifier code compiles, and each task's
code verifier run against the untouched initial database.

The checks reuse what capture and online training run, so they find what those would meet: the database is
built by :func:`~echo_trl.envs.awm.scenario.database.build_image` (statements that fail are recorded and the
rest is built, as the official ``awm env reset_db`` does), the server is started and its tools listed by an
:class:`~echo_trl.envs.awm.runtime.episode.AWMRuntime` (the contained server every pool slot runs), and each
verifier runs through :func:`~echo_trl.envs.awm.runtime.verifier.verify_databases` with the initial image as
both the initial and the final database: exactly what a pooled rollout that only calls ``verify`` is judged on
(its database copy is the initial image until its first tool call).

Compiling a verifier's code on the host only parses it (nothing of it runs here); running it happens in the
verifier's sandbox. Every message is one line, free of times and paths, so results compare across reruns.
"""

from __future__ import annotations

import ast
import tempfile
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from ....clients.mcp import MCPError
from ....errors import EchoTrlError
from ....sandbox import bwrap
from ....sandbox.bwrap import ContainmentUnavailable
from ..runtime.episode import AWMRuntime
from ..runtime.settings import AWMSettings
from ..runtime.verifier import verify_databases
from ..scenario.database import build_image
from ..scenario.source import FILES, Scenario, ScenarioError
from .report import missing_part, one_line, scenario_digest

VERIFIER_MODE = "code"  # what capture and online training run (SQL mode needs an LLM judge)


def check_database(scenario: Scenario) -> tuple[dict[str, Any], bytes | None]:
    """The database part of the result, and the initial image (``None`` when no database could be built)."""
    if scenario.db_schema is None:
        return {"built": False, "tables": 0, "rows": 0, "failed_statements": [], "error": missing_part("db")}, None
    with tempfile.TemporaryDirectory(prefix="echo_trl_check_db_") as work:
        try:
            built, image = build_image(scenario, work)
        except ScenarioError as exc:
            error = one_line(exc.message)
            return {"built": False, "tables": 0, "rows": 0, "failed_statements": [], "error": error}, None
    failed = [one_line(s) for s in (*built.failed_tables, *built.failed_inserts)]
    result = {"built": True, "tables": built.tables, "rows": built.inserts, "failed_statements": failed, "error": None}
    return result, image


def server_failure(exc: BaseException) -> str:
    """One line for a server that did not start: what happened, and the last line of its log (the exception)."""
    message = exc.message if isinstance(exc, ScenarioError) else str(exc)
    head, _, log = message.partition("; server log:")
    last = next((line.strip() for line in reversed(log.splitlines()) if line.strip()), "")
    return one_line(f"{head}: {last}" if last else head)


def check_server(scenario: Scenario, settings: AWMSettings, containment: bwrap.Containment) -> dict[str, Any]:
    """Start the scenario's server (contained), list its tools, stop it."""
    if scenario.env_code is None:
        return {"started": False, "tools": None, "error": f"no server code: {missing_part('envs')}"}
    runtime = AWMRuntime(scenario, settings=settings, containment=containment)
    try:
        runtime.start()
        return {"started": True, "tools": len(runtime.tools), "error": None}
    except ContainmentUnavailable:
        raise
    except (EchoTrlError, MCPError, OSError) as exc:
        return {"started": False, "tools": None, "error": server_failure(exc)}
    finally:
        runtime.close()


def compile_errors(scenario: Scenario) -> list[str]:
    """Every verifier (both modes) whose code does not compile or defines no entry point, one line each."""
    out = []
    for (k, mode), spec in sorted(scenario.verifiers.items()):
        where = f"task {k} {mode} verifier ({spec.source})"
        try:
            tree = ast.parse(spec.code, filename=f"<verifier {scenario.name} task {k}>")
            compile(tree, f"<verifier {scenario.name} task {k}>", "exec", dont_inherit=True)
        except SyntaxError as exc:
            out.append(one_line(f"{where}: {type(exc).__name__}: line {exc.lineno}: {exc.msg}"))
            continue
        except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, nesting past the parser's limits
            out.append(one_line(f"{where}: {type(exc).__name__}: {exc}"))
            continue
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        if spec.function not in names:
            out.append(one_line(f"{where}: defines no function {spec.function!r}"))
    return out


def check_task(
    scenario: Scenario, task_idx: int, image: bytes | None, *, timeout: float, containment: bwrap.Containment
) -> dict[str, Any]:
    """The task's code verifier run against the untouched initial database, as an outcome with its reason."""
    spec = scenario.verifier(task_idx, VERIFIER_MODE)
    head = {"task_idx": task_idx, "verifier": spec.source if spec is not None else None}
    if spec is None:
        reason = f"no code verifier: no line for this task in {FILES['verifier_code']}"
        return {**head, "outcome": "no_verifier", "reason": reason}
    if image is None:
        return {**head, "outcome": "not_checked", "reason": "no initial database to run the verifier on"}
    outcome = verify_databases(
        scenario,
        task_idx,
        image,
        image,
        verifier_mode=VERIFIER_MODE,
        timeout=timeout,
        judge=None,
        containment=containment,
        task=scenario.tasks[task_idx],
    )
    result = outcome.verify_result
    if outcome.reward_type == "complete":
        reason = "the verifier returns 'complete' on the untouched database: an agent that does nothing scores it"
        return {**head, "outcome": "already_satisfied", "reason": reason}
    if outcome.reward_type == "others":
        return {**head, "outcome": "ok", "reason": "the verifier returns 'others' on the untouched database"}
    error_type = result.get("error_type")
    message = result.get("error_message") or result.get("execution_status") or outcome.reward_type
    return {
        **head,
        "outcome": "verifier_error",
        "reason": one_line(f"{error_type}: {message}" if error_type else message),
    }


def _status(result: dict[str, Any], scenario: Scenario) -> tuple[str, str | None, list[str]]:
    """(status, why unusable, problems) of a scenario from its parts."""
    db, server = result["database"], result["server"]
    problems = []
    if not db["built"]:
        problems.append(f"database not built: {db['error']}")
    elif db["failed_statements"]:
        n = len(db["failed_statements"])
        problems.append(one_line(f"database: {n} statement(s) failed: {'; '.join(db['failed_statements'])}"))
    if db["built"] and scenario.sample_data is None:
        problems.append(f"database has no sample rows: {missing_part('sample')}")
    if not server["started"]:
        problems.append(f"server not started: {server['error']}")
    elif not server["tools"]:
        problems.append("the server lists no tools")
    problems += [f"does not compile: {e}" for e in result["verifiers"]["compile_errors"]]
    if not scenario.tasks:
        why: str | None = f"no tasks: {missing_part('tasks')}"
    elif not db["built"]:
        why = f"database not built: {db['error']}"
    elif not server["started"]:
        why = f"server not started: {server['error']}"
    elif not server["tools"]:
        why = "the server lists no tools"
    else:
        return ("database_errors" if db["failed_statements"] else "ok"), None, problems
    return "unusable", why, problems


def check_scenario(
    scenario: Scenario,
    *,
    settings: AWMSettings,
    containment: bwrap.Containment,
    executor: Executor | None = None,
) -> dict[str, Any]:
    """Every check of ``scenario`` as one JSON-ready result (see :mod:`~echo_trl.envs.awm.check.report`).

    ``executor`` runs the tasks' verifiers concurrently (each is a sandboxed process); without one they run in
    turn. ``settings.verifier_timeout`` bounds each verifier run.
    """
    database, image = check_database(scenario)
    server = (
        check_server(scenario, settings, containment)
        if image is not None or scenario.env_code is None
        else {"started": False, "tools": None, "error": "not started: no initial database"}
    )
    run: Callable[[int], dict[str, Any]] = lambda k: check_task(  # noqa: E731
        scenario, k, image, timeout=settings.verifier_timeout, containment=containment
    )
    indices = range(len(scenario.tasks))
    tasks = [f.result() for f in [executor.submit(run, k) for k in indices]] if executor else [run(k) for k in indices]
    modes = [mode for _, mode in scenario.verifiers]
    result: dict[str, Any] = {
        "scenario": scenario.name,
        "digest": scenario_digest(scenario),
        "database": database,
        "server": server,
        "verifiers": {
            "code": modes.count("code"),
            "sql": modes.count("sql"),
            "compile_errors": compile_errors(scenario),
        },
        "tasks": tasks,
    }
    status, why, problems = _status(result, scenario)
    return {"scenario": scenario.name, "status": status, "unusable_because": why, "problems": problems, **result}


def unreadable_result(name: str, error: ScenarioError) -> dict[str, Any]:
    """The result of a scenario whose records do not read (never reused: there is no data to digest)."""
    why = one_line(f"unreadable: {error}")
    return {
        "scenario": name,
        "status": "unusable",
        "unusable_because": why,
        "problems": [why],
        "digest": None,
        "database": {"built": False, "tables": 0, "rows": 0, "failed_statements": [], "error": why},
        "server": {"started": False, "tools": None, "error": "not started: the scenario does not read"},
        "verifiers": {"code": 0, "sql": 0, "compile_errors": []},
        "tasks": [],
    }
