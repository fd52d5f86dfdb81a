"""The prompts of online training: one row per AWM task, in TRL's conversational format."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ....data.readers.prompt import DEFAULT_SYSTEM_PROMPT, prompt_messages
from ..check.usable import ReportError, ScenarioReport, as_report, usable_selection
from ..scenario.source import Scenario

logger = logging.getLogger(__name__)


def awm_task_dataset(
    scenario: Scenario | Sequence[Scenario],
    task_indices: list[int] | dict[str, list[int] | None] | None = None,
    *,
    repeats: int = 1,
    system_prompt: str | None = None,
    scenario_report: ScenarioReport | dict[str, Any] | str | Path | None = None,
    include_unusable: bool = False,
):
    """A ``datasets.Dataset`` of prompts for online training: one row per task (x ``repeats``).

    Columns: ``prompt`` (system + user task, TRL conversational format), ``task_idx``,
    ``scenario``; with several scenarios also ``environment`` (= ``scenario``, the column TRL's
    multi-environment mode routes by), rows interleaved across scenarios so every batch mixes
    them. ``task_indices``: a list (one scenario) or ``{scenario: list or None}``; None = every
    task. ``system_prompt``: ``{scenario}`` is filled in, other braces are text. ``scenario_report``
    (``echo-trl check-scenarios``' report, or its path): the scenarios and tasks it marks unusable (e.g. a task
    whose untouched database already passes its verifier) get no rows, with a logged warning saying how many and
    why, unless ``include_unusable``.
    """
    from datasets import Dataset

    many = not isinstance(scenario, Scenario)
    scenarios = list(scenario) if many else [scenario]
    report = as_report(scenario_report)
    if report is not None:
        wanted = task_indices if isinstance(task_indices, dict) else {sc.name: task_indices for sc in scenarios}
        scenarios, task_indices, skipped = usable_selection(
            report, scenarios, wanted, include_unusable=include_unusable
        )
        if skipped and not include_unusable:
            logger.warning("awm_task_dataset: %s", " ".join(skipped.lines()))
        if not scenarios:
            raise ReportError("awm_task_dataset: the scenario report marks every task asked for unusable")
    template = system_prompt if system_prompt is not None else DEFAULT_SYSTEM_PROMPT
    per_scenario = []
    for sc in scenarios:
        chosen = task_indices.get(sc.name) if isinstance(task_indices, dict) else task_indices
        per_scenario.append(
            [
                (sc, k, prompt_messages(template, sc.name, sc.task(k)))
                for k in (chosen if chosen is not None else range(len(sc.tasks)))
                for _ in range(repeats)
            ]
        )
    rows: dict[str, list[Any]] = {
        "prompt": [],
        "task_idx": [],
        "scenario": [],
        **({"environment": []} if many else {}),
    }
    for i in range(max(map(len, per_scenario), default=0)):
        for items in per_scenario:
            if i < len(items):
                sc, k, prompt = items[i]
                rows["prompt"].append(prompt)
                rows["task_idx"].append(k)
                rows["scenario"].append(sc.name)
                if many:
                    rows["environment"].append(sc.name)
    return Dataset.from_dict(rows)
