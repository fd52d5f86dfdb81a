"""Which scenarios and tasks a scenario report lets capture and online training use, and what was skipped why.

Unusable: a scenario whose database could not be built, whose server does not start or lists no tools, or
that has no tasks; a task whose outcome is not ``ok`` (``already_satisfied``, ``verifier_error``,
``no_verifier``, ``not_checked``) or whose scenario is unusable. They are skipped by default and listed with
their reasons; ``include_unusable`` keeps them (and still lists them).

A report is only trusted for the data it was made from: a scenario the report does not cover, or whose data
changed since (another digest), is a one-line error asking for a new check, never a silent pass.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....errors import EchoTrlError
from ..scenario.source import Scenario
from .report import CHECK_VERSION, REPORT_FILE, REPORT_KIND, scenario_digest, task_ranges

__all__ = ["ScenarioReport", "Skipped", "as_report", "screen_scenarios", "usable_selection"]

logger = logging.getLogger(__name__)


class ReportError(EchoTrlError):
    """A scenario report that cannot be read, or that does not cover the scenarios asked for."""


@dataclass(frozen=True)
class ScenarioReport:
    """A report of ``echo-trl check-scenarios``, read back: each scenario's result by name.

    ``ScenarioReport.load(path)`` reads the report file or the check's output directory. The factories,
    ``awm_task_dataset`` and capture take one (or the path itself) as ``scenario_report``; a scenario the report
    does not cover, or whose data changed since it was checked, is refused in one line.
    """

    path: str
    results: dict[str, dict[str, Any]]

    @classmethod
    def from_report(cls, report: dict[str, Any], path: str = "<report>") -> ScenarioReport:
        """From a report dict (as :func:`~echo_trl.envs.awm.check.run.check_scenarios` returns it)."""
        if not isinstance(report, dict) or report.get("report") != REPORT_KIND:
            raise ReportError(f"{path}: not a scenario report of `echo-trl check-scenarios` (no 'report' field)")
        if report.get("version") != CHECK_VERSION:
            raise ReportError(
                f"{path}: version: made by another version of the check ({report.get('version')!r}, this one "
                f"reads {CHECK_VERSION}): run `echo-trl check-scenarios` again"
            )
        scenarios = report.get("scenarios")
        if not isinstance(scenarios, list):
            raise ReportError(f"{path}: scenarios: expected a list")
        results = {}
        for i, r in enumerate(scenarios):
            for key, kind in (("scenario", str), ("status", str), ("tasks", list)):
                if not isinstance(r, dict) or not isinstance(r.get(key), kind):
                    raise ReportError(f"{path}: scenarios[{i}].{key}: expected a {kind.__name__}")
            for j, t in enumerate(r["tasks"]):
                if not isinstance(t, dict) or not isinstance(t.get("task_idx"), int) or "outcome" not in t:
                    raise ReportError(f"{path}: scenarios[{i}].tasks[{j}]: expected {{task_idx, outcome, reason}}")
            results[r["scenario"]] = r
        return cls(path, results)

    @classmethod
    def load(cls, path: str | Path) -> ScenarioReport:
        """Read a report: its JSON file, or the check's output directory holding ``scenario_report.json``."""
        p = Path(path)
        file = p / REPORT_FILE if p.is_dir() else p
        try:
            report = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ReportError(
                f"{file}: no such file (run `echo-trl check-scenarios DATA --output DIR` first)"
            ) from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ReportError(f"{file}: not a readable JSON report ({' '.join(str(exc).split())})") from None
        return cls.from_report(report, str(file))

    def result(self, scenario: Scenario) -> dict[str, Any]:
        """The report's result for ``scenario``, checked to be about the same data."""
        r = self.results.get(scenario.name)
        if r is None:
            raise ReportError(
                f"{self.path}: has no result for scenario {scenario.name!r} (it covers {len(self.results)}): "
                "check it with `echo-trl check-scenarios`"
            )
        if r.get("digest") is not None and r.get("digest") != scenario_digest(scenario):
            raise ReportError(
                f"{self.path}: scenario {scenario.name!r} was checked on other data (its files changed since): "
                "run `echo-trl check-scenarios` again"
            )
        return r

    def scenario_problem(self, scenario: Scenario) -> str | None:
        """Why ``scenario`` is unusable, or ``None``."""
        r = self.result(scenario)
        return (r.get("unusable_because") or "unusable") if r["status"] == "unusable" else None

    def task_problems(self, scenario: Scenario) -> dict[int, tuple[str, str]]:
        """``{task_idx: (outcome, reason)}`` of the scenario's tasks that are not ``ok``."""
        return {
            t["task_idx"]: (t["outcome"], str(t.get("reason", "")))
            for t in self.result(scenario)["tasks"]
            if t["outcome"] != "ok"
        }


@dataclass
class Skipped:
    """What a report made a caller leave out (or, with ``include_unusable``, what it kept although unusable)."""

    scenarios: dict[str, str] = field(default_factory=dict)  # name -> why unusable
    tasks: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)  # (name, k) -> (outcome, reason)
    included: bool = False

    def __bool__(self) -> bool:
        return bool(self.scenarios or self.tasks)

    def lines(self, *, hint: str = "include_unusable=True") -> list[str]:
        """How many were skipped and why, in a few lines (the full reasons are in the report)."""
        if not self:
            return []
        verb = "kept although the scenario report marks them unusable" if self.included else "skipped"
        out = []
        if self.scenarios:
            names = "; ".join(f"{n} ({why})" for n, why in sorted(self.scenarios.items()))
            out.append(f"{verb}: {len(self.scenarios)} scenario(s): {names}")
        by_outcome: dict[str, dict[str, list[int]]] = {}
        for (name, k), (outcome, _) in sorted(self.tasks.items()):
            by_outcome.setdefault(outcome, {}).setdefault(name, []).append(k)
        for outcome, per in sorted(by_outcome.items()):
            n = sum(map(len, per.values()))
            where = "; ".join(f"{name} {task_ranges(ks)}" for name, ks in per.items())
            out.append(f"{verb}: {n} task(s) {outcome}: {where}")
        if not self.included:
            out.append(f"(the scenario report says why; {hint} keeps them)")
        return out


def usable_selection(
    report: ScenarioReport,
    scenarios: Sequence[Scenario],
    tasks: dict[str, Iterable[int]] | None = None,
    *,
    include_unusable: bool = False,
) -> tuple[list[Scenario], dict[str, list[int]], Skipped]:
    """The scenarios and tasks to use, and what was skipped.

    ``tasks``: each scenario's candidate task indices (absent or ``None``: every task). With
    ``include_unusable`` nothing is dropped; the returned :class:`Skipped` then lists what was kept anyway.
    """
    skipped = Skipped(included=include_unusable)
    kept: list[Scenario] = []
    kept_tasks: dict[str, list[int]] = {}
    for sc in scenarios:
        candidates = list((tasks or {}).get(sc.name) or range(len(sc.tasks)))
        why = report.scenario_problem(sc)
        if why is not None:
            skipped.scenarios[sc.name] = why
            if not include_unusable:
                continue
        problems = report.task_problems(sc)
        bad = {k: problems[k] for k in candidates if k in problems}
        skipped.tasks.update({(sc.name, k): v for k, v in bad.items()})
        ks = candidates if include_unusable else [k for k in candidates if k not in bad]
        if ks:
            kept.append(sc)
            kept_tasks[sc.name] = ks
    return kept, kept_tasks, skipped


def as_report(report: ScenarioReport | dict[str, Any] | str | Path | None) -> ScenarioReport | None:
    """A :class:`ScenarioReport` from a loaded one, a report dict, or the path of a report (or its directory)."""
    if report is None or isinstance(report, ScenarioReport):
        return report
    if isinstance(report, dict):
        return ScenarioReport.from_report(report)
    return ScenarioReport.load(report)


def screen_scenarios(
    scenarios: Sequence[Scenario],
    report: ScenarioReport | dict[str, Any] | str | Path | None,
    *,
    include_unusable: bool = False,
    caller: str = "AWM environments",
) -> tuple[list[Scenario], dict[tuple[str, int], str]]:
    """For the online environment factories: the scenarios to serve, and ``{(scenario, task_idx): why}`` of the
    tasks a rollout may not start (their environment refuses such a row at ``reset``).

    Without a report everything is kept. Scenarios left out are logged (a warning naming them and why).
    """
    loaded = as_report(report)
    if loaded is None:
        return list(scenarios), {}
    kept, _, skipped = usable_selection(loaded, scenarios, include_unusable=include_unusable)
    dropped = {sc.name: skipped.scenarios.get(sc.name, "no usable task") for sc in scenarios if sc not in kept}
    if dropped:
        names = "; ".join(f"{n} ({why})" for n, why in sorted(dropped.items()))
        logger.warning(
            "%s: left out %d scenario(s) the scenario report marks unusable: %s", caller, len(dropped), names
        )
    blocked = {} if include_unusable else {key: f"{o}: {r}" for key, (o, r) in skipped.tasks.items()}
    return kept, blocked
