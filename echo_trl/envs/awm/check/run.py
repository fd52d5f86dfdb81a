"""Check many AWM scenarios at once into a resumable output, and write the report.

Why resumable: AWM-1K has 1,000 scenarios, and a check starts a server and runs ten verifiers for each
(minutes to hours on a small machine). Each scenario's result is appended to ``scenario_check.jsonl`` as it
finishes, through :class:`~echo_trl.io.jsonl_store.JsonlStore` (one writer, whole fsynced lines, the
settings of the first run kept); a rerun into the same output reuses every result whose scenario data is
unchanged (same digest) and checks only the rest. ``concurrency`` scenarios are checked at once (each starts
at most one server at a time) and their tasks' verifiers share as many sandboxed verifier processes.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....errors import EchoTrlError
from ....io.atomic import write_file
from ....io.jsonl_store import JsonlStore, StoreError
from ....io.outputs import check_output_dir
from ....progress import progress
from ....sandbox import bwrap
from ..runtime.settings import AWMSettings
from ..scenario.source import Scenario, ScenarioError, ScenarioSource
from .report import (
    CHECK_VERSION,
    LOCK_FILE,
    REPORT_FILE,
    RESULTS_FILE,
    STATE_FILE,
    assemble_report,
    scenario_digest,
)
from .scenario_check import VERIFIER_MODE, check_scenario, unreadable_result

__all__ = ["CheckSettings", "ResultStore", "check_scenarios", "source_label"]


@dataclass(frozen=True)
class CheckSettings:
    """What one check run covers and how.

    Parameters:
        output: the output directory (created; a rerun into it reuses the results of unchanged scenarios).
        scenarios: scenario names; empty: every scenario the data has tasks for.
        concurrency: scenarios checked at once (and verifier processes at once).
        verifier_timeout: seconds each verifier run may take (longer is a ``verifier_error``).
        unsafe_no_sandbox: run the generated code uncontained (only for code you trust).
    """

    output: Path
    scenarios: tuple[str, ...] = ()
    concurrency: int = 4
    verifier_timeout: float = 30.0
    unsafe_no_sandbox: bool = False

    def kept(self) -> dict[str, Any]:
        """The settings that shape results: a rerun into the same output must keep them."""
        return {
            "check_version": CHECK_VERSION,
            "verifier_mode": VERIFIER_MODE,
            "verifier_timeout": self.verifier_timeout,
        }


class CheckStoreError(StoreError):
    """The check's output cannot be written into (other settings, another check running, a damaged line)."""


class ResultStore(JsonlStore):
    """The check's output directory: one result per line, the last line of a scenario wins."""

    error = CheckStoreError

    def __init__(self, out: Path):
        super().__init__(
            out, pattern=RESULTS_FILE, lock_file=LOCK_FILE, state_file=STATE_FILE, writer="check-scenarios"
        )

    def results(self) -> dict[str, dict[str, Any]]:
        """Every stored result by scenario (a later line replaces an earlier one of the same scenario)."""
        out: dict[str, dict[str, Any]] = {}
        for path in self.paths():
            with open(path, encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, start=1):
                    try:
                        result = json.loads(line)
                        out[result["scenario"]] = result
                    except (ValueError, TypeError, KeyError):
                        raise CheckStoreError(
                            f"{path}:{lineno}: not a check result (move the file away to check again)"
                        ) from None
        return out

    def add(self, result: dict[str, Any]) -> None:
        self.append(RESULTS_FILE, result)


def source_label(source: ScenarioSource) -> str:
    """Where the scenarios came from, as the report names it."""
    if source.directory is not None:
        return str(source.directory)
    return f"hf://datasets/{source.hub_repo}" + (f"@{source.revision}" if source.revision else "")


def _load(source: ScenarioSource, name: str) -> Scenario | ScenarioError:
    """The scenario, or the error its records give (a scenario the data does not have at all is the caller's
    mistake: raised)."""
    try:
        return source.load(name)
    except ScenarioError as exc:
        if not exc.source:  # "not found": no file names it
            raise
        return exc


def _checked(
    todo: list[Scenario], settings: AWMSettings, containment: bwrap.Containment, concurrency: int
) -> Iterator[dict[str, Any]]:
    """Check ``todo`` with ``concurrency`` scenarios at once; yield each result as it finishes.

    The first scenario whose check raises (not a finding about the scenario: e.g. the sandbox failing) stops new
    ones from starting; those running finish, their results are yielded, then the error is raised.
    """
    pending = iter(todo)
    failure: BaseException | None = None
    with (
        ThreadPoolExecutor(concurrency, thread_name_prefix="echo-check") as scenarios,
        ThreadPoolExecutor(concurrency, thread_name_prefix="echo-check-verifier") as verifiers,
    ):
        running: set[Future] = set()

        def refill() -> None:
            while failure is None and len(running) < concurrency:
                sc = next(pending, None)
                if sc is None:
                    return
                running.add(
                    scenarios.submit(
                        check_scenario, sc, settings=settings, containment=containment, executor=verifiers
                    )
                )

        refill()
        try:
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    running.discard(fut)
                    try:
                        result = fut.result()
                    except BaseException as exc:  # noqa: BLE001 - raised once the others finished
                        failure = failure or exc
                        continue
                    yield result
                refill()
        except BaseException:  # the consumer stopped (Ctrl-C): start nothing more
            failure = failure or RuntimeError("stopped")
            for fut in running:
                fut.cancel()
            raise
    if failure is not None:
        raise failure


def check_scenarios(
    source: ScenarioSource, settings: CheckSettings, *, show_progress: bool | None = None
) -> dict[str, Any]:
    """Check ``settings.scenarios`` (default: all) of ``source`` into ``settings.output``; return the report.

    The report (also written to ``OUTPUT/scenario_report.json``) covers the scenarios of this run: the results
    stored by earlier runs for unchanged scenarios, and the ones checked now.
    """
    if settings.concurrency < 1:
        raise EchoTrlError(f"concurrency must be >= 1, got {settings.concurrency}")
    names = list(dict.fromkeys(settings.scenarios or source.list_scenarios()))
    if not names:
        raise EchoTrlError(f"{source_label(source)}: no scenario has tasks (gen_tasks.jsonl is missing or empty)")
    loaded = {name: _load(source, name) for name in names}
    containment = bwrap.require_containment(settings.unsafe_no_sandbox)
    out = check_output_dir(Path(settings.output))
    store = ResultStore(out)
    store.acquire()
    t0 = time.perf_counter()
    try:
        store.check_settings(settings.kept())
        known = store.results()
        results: dict[str, dict[str, Any]] = {}
        todo, reused = [], 0
        for name, sc in loaded.items():
            if isinstance(sc, ScenarioError):
                results[name] = unreadable_result(name, sc)
            elif known.get(name, {}).get("digest") == scenario_digest(sc):
                results[name] = known[name]
                reused += 1
            else:
                todo.append(sc)
        environment = AWMSettings(
            verifier_timeout=settings.verifier_timeout, unsafe_no_sandbox=settings.unsafe_no_sandbox
        )
        checked = _checked(todo, environment, containment, settings.concurrency)
        with contextlib.closing(checked):
            for result in progress(
                checked, desc="check-scenarios", unit="scenario", total=len(todo), enable=show_progress
            ):
                store.add(result)
                results[result["scenario"]] = result
    finally:
        store.release()
    run = {
        "checked": len(todo),
        "reused": reused,
        "seconds": round(time.perf_counter() - t0, 2),
        "containment": "bubblewrap" if containment.contained else "none (unsafe_no_sandbox)",
    }
    report = assemble_report(results.values(), source=source_label(source), settings=settings.kept(), run=run)
    write_file(out / REPORT_FILE, json.dumps(report, indent=2) + "\n")
    return report
