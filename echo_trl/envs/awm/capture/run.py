"""One collection run: which scenarios and tasks, the jobs not collected yet, played on one bounded pool.

:class:`CollectionSettings` is everything a run needs besides the policy and where scenarios come from
(``echo-trl capture`` builds it from its flags); :func:`collect` picks the scenarios and tasks (errors
before anything starts), checks the output and takes its lock, skips the jobs already there, plays the
rest with ``concurrency`` in flight on one :class:`~echo_trl.envs.awm.runtime.pool.ServerPool`, stores
each record as it finishes, and returns the summary of everything the output holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....clients.openai import ClientError
from ....io.outputs import check_output_dir
from ....progress import progress
from ....sandbox.bwrap import Containment
from ..check.report import REPORT_FILE
from ..check.run import CheckSettings, check_scenarios
from ..check.usable import ScenarioReport, Skipped, as_report, usable_selection
from ..policies.policy import PolicyError
from ..policies.replay import ReplayPolicy
from ..runtime.pool import ServerPool
from ..runtime.settings import AWMSettings
from ..scenario.source import Scenario, ScenarioError, ScenarioSource
from .jobs import plan_jobs, pooled_runner, run_jobs
from .store import EpisodeStore
from .summary import summarize, write_summary

__all__ = ["CollectionResult", "CollectionSettings", "collect", "episodes_for"]


@dataclass(frozen=True)
class CollectionSettings:
    """What one collection run plays and where it writes.

    Parameters:
        output: the output directory (created; a rerun into it continues the collection).
        scenarios: scenario names, in order.
        skip_without_server_code: skip (and list) scenarios without server code instead of refusing them
            (``--all-scenarios``).
        task_indices: the tasks to play; empty: every task (a replay: the tasks its scripts cover).
        episodes: episodes per task (a GRPO group); ``None``: one, or each recording once for a replay of
            recorded episodes.
        concurrency: episodes in flight at once.
        format: the conversation format recorded (``chat-template`` | ``awm-agent``).
        verify_turn: where the record keeps the verifier step (``env_output`` | ``omit``).
        environment: the AWM environment settings (timeouts, verifier, sandbox, ``stop_on_format_error``);
            its ``max_servers`` is replaced by this run's bound.
        max_servers: the pool's bound; ``None``: ``min(concurrency, 8)``.
        shaping: the settings that shape the episodes, kept in the output: a rerun with others is refused
            (its groups would mix two policies).
        scenario_report: a report of ``echo-trl check-scenarios`` (or its path): the scenarios and tasks it marks
            unusable are skipped (and listed); ``None``: every one is played.
        check: check the scenarios first (into the output, reused by a rerun) and skip what the check marks
            unusable; a given ``scenario_report`` wins.
        include_unusable: play the scenarios and tasks the report marks unusable too (still listed).
    """

    output: Path
    scenarios: tuple[str, ...] = ()
    skip_without_server_code: bool = False
    task_indices: tuple[int, ...] = ()
    episodes: int | None = None
    concurrency: int = 1
    format: str = "chat-template"
    verify_turn: str = "env_output"
    environment: AWMSettings = AWMSettings()
    max_servers: int | None = None
    shaping: Mapping[str, Any] = field(default_factory=dict)
    scenario_report: Any = None
    check: bool = False
    include_unusable: bool = False


@dataclass
class CollectionResult:
    """What a run did: the summary of the output, the tasks it covered, what it skipped, where it ran."""

    output: Path
    summary: dict[str, Any]
    tasks: dict[str, list[int]]
    not_runnable: list[str]
    containment: Containment
    databases: dict[str, str]  # scenario -> its database build report
    skipped: list[str] = field(default_factory=list)  # what the scenario report made the run leave out, and why


def episodes_for(policy: Any, episodes: int | None, scenario: str, task_idx: int) -> int:
    """Episodes of one task: ``episodes`` when given; else each recording once (a replay of recorded
    episodes), else one."""
    if episodes is not None:
        return episodes
    if isinstance(policy, ReplayPolicy) and policy.recorded:
        return max(1, policy.count(scenario, task_idx))
    return 1


def select(
    settings: CollectionSettings, source: ScenarioSource, policy: Any
) -> tuple[list[Scenario], dict[str, list[int]], list[str], Skipped]:
    """The scenarios to run, their tasks (each range-checked), the names skipped for lack of server code and
    what the scenario report made the run skip."""
    scenarios, not_runnable = [], []
    for name in settings.scenarios:
        scenario = source.load(name)
        try:
            scenario.require("env_code")
        except ScenarioError:
            if not settings.skip_without_server_code:
                raise
            not_runnable.append(name)
            continue
        scenarios.append(scenario)
    tasks: dict[str, list[int]] = {}
    for sc in scenarios:
        ks = settings.task_indices or (
            policy.tasks(sc.name) if isinstance(policy, ReplayPolicy) else range(len(sc.tasks))
        )
        for k in ks:
            sc.task(k)  # range check with a clear error before anything starts
        if ks:
            tasks[sc.name] = list(ks)
    skipped = Skipped()
    report = scenario_report(settings, source, tuple(tasks))
    if report is not None and tasks:
        scenarios, tasks, skipped = usable_selection(
            report, [sc for sc in scenarios if sc.name in tasks], tasks, include_unusable=settings.include_unusable
        )
        if not tasks:
            raise PolicyError(f"no task to play: {' '.join(skipped.lines(hint='--include_unusable'))}")
    if not tasks:
        raise PolicyError(
            "no task to play: "
            + ("the replay file has no scripts for these scenarios" if scenarios else "no scenario with server code")
        )
    return scenarios, tasks, not_runnable, skipped


def scenario_report(
    settings: CollectionSettings, source: ScenarioSource, names: tuple[str, ...]
) -> ScenarioReport | None:
    """The report the run screens scenarios and tasks with: the given one, or a check of ``names`` run now."""
    if settings.scenario_report is not None or not settings.check:
        return as_report(settings.scenario_report)
    check = CheckSettings(
        output=Path(settings.output),
        scenarios=names,
        concurrency=settings.max_servers or min(settings.concurrency, 8),
        verifier_timeout=settings.environment.verifier_timeout,
        unsafe_no_sandbox=settings.environment.unsafe_no_sandbox,
    )
    return ScenarioReport.from_report(check_scenarios(source, check), str(Path(settings.output) / REPORT_FILE))


def _stop(pool: ServerPool, policy: Any) -> None:
    """End the episodes in flight of a stopped run: their servers stopped, their policy's requests ended."""
    pool.close()
    stop = getattr(policy, "stop", None)  # a policy waiting on an inference server (see Policy)
    if stop is not None:
        stop()


def collect(
    settings: CollectionSettings,
    source: ScenarioSource,
    policy: Any,
    *,
    sampler: dict[str, Any] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> CollectionResult:
    """Collect into ``settings.output`` (see the module docstring); ``on_record`` sees each finished record
    before it is stored. A policy or server failure stops the run: the error says how many episodes of this
    run were kept, and the same command continues it."""
    scenarios, tasks, not_runnable, skipped = select(settings, source, policy)
    out = check_output_dir(Path(settings.output))
    store = EpisodeStore(out)
    store.acquire()
    try:
        store.check_settings(dict(settings.shaping))
        done = store.done_keys()
        jobs = plan_jobs(tasks, lambda s, k: episodes_for(policy, settings.episodes, s, k))
        todo = [j for j in jobs if j.key not in done]
        t0 = time.perf_counter()
        bound = settings.max_servers or min(settings.concurrency, 8)
        with ServerPool(settings=settings.environment.replace(max_servers=bound)) as pool:
            for sc in scenarios:
                if sc.name in tasks:
                    pool.add(sc)
            run = pooled_runner(
                pool,
                policy,
                verify_turn=settings.verify_turn,
                format=settings.format,
                stop_on_format_error=settings.environment.stop_on_format_error,
                sampler=sampler,
            )
            desc = f"capture {len(tasks)} scenario(s)"
            records = run_jobs(todo, run, concurrency=settings.concurrency, on_stop=lambda: _stop(pool, policy))
            try:
                for record in progress(records, desc=desc, unit="episode", total=len(todo)):
                    if on_record is not None:
                        on_record(record)
                    store.add(record)
            except (PolicyError, ClientError) as exc:
                raise PolicyError(
                    f"{exc} ({store.written} episode(s) of this run kept in {out}: rerun the same command to continue)"
                ) from None
            finally:  # stopped while a record was stored: the episodes in flight end now, not at exit
                records.close()
            containment, stats = pool.containment, pool.stats
        elapsed = time.perf_counter() - t0
        summary = summarize(list(store.records()))
    finally:
        store.release()
    summary["run"] = {
        "episodes": store.written,
        "already_there": len(jobs) - len(todo),
        "seconds": round(elapsed, 2),
        "episodes_per_s": round(store.written / elapsed, 3) if elapsed > 0 else None,
        "concurrency": settings.concurrency,
        "server_starts": stats.starts,
        "repaired": list(store.repaired),
    }
    skipped_lines = skipped.lines(hint="--include_unusable")
    if skipped_lines:  # what this run's scenario report left out (or kept although unusable), and why
        summary["run"]["scenario_report"] = skipped_lines
    write_summary(out, summary)
    return CollectionResult(out, summary, tasks, not_runnable, containment, dict(stats.databases), skipped_lines)
