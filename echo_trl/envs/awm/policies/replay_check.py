"""Whether a replayed episode saw what its recording saw: each step compared with the recorded one.

Every replayed step of a recorded episode is compared with the recording: its observation text after
:func:`normalize_timestamps` (databases built from AWM samples carry their creation time), and its
``reward_type`` and reward where the recording has them. The step gets ``"replay_match": true|false``
(and ``replay_diff``, naming each field that differs, with the recorded and the live value), the episode
a note with the count.
"""

from __future__ import annotations

import re
from typing import Any

from ..runtime.episode import Episode
from .policy import observation_text

_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
_DATE = re.compile(r"(?<![\d-])\d{4}-\d{2}-\d{2}(?![\d-])")


def normalize_timestamps(text: str) -> str:
    """``text`` with ISO dates and date-times replaced by ``<date>`` / ``<datetime>``.

    Why: AWM sample rows are inserted with ``datetime('now', ...)``, so the same episode replayed
    on another day differs in exactly these places and nowhere else.
    """
    return _DATE.sub("<date>", _DATETIME.sub("<datetime>", text))


def replay_diff(step: dict[str, Any], text: str, outcome: tuple[Any, Any] | None) -> list[str]:
    """The fields in which a replayed ``step`` differs from the recorded text and (reward_type, reward)."""
    diff = []
    if normalize_timestamps(observation_text(step["observation"])) != normalize_timestamps(text):
        diff.append("observation text")
    reward_type, reward = outcome or (None, None)
    live_type, live = step["observation"].get("reward_type"), step.get("reward")
    if reward_type is not None and live_type != reward_type:
        diff.append(f"reward_type {reward_type} -> {live_type}")
    if reward is not None and (live is None or abs(float(live) - float(reward)) > 1e-9):
        diff.append(f"reward {reward} -> {live}")
    return diff


def check_replay(
    episode: Episode, expected: list[str], outcomes: list[tuple[Any, Any]], observed: list[dict[str, Any]]
) -> None:
    """Mark each replayed step with whether it equals the recorded one (timestamps aside) and how it differs."""
    steps = episode.steps[-len(observed) :] if observed else []
    matches = []
    for i, (step, want) in enumerate(zip(steps, expected, strict=False)):
        diff = replay_diff(step, want, outcomes[i] if i < len(outcomes) else None)
        step["replay_match"] = not diff
        if diff:
            step["replay_diff"] = diff
        matches.append(not diff)
    episode.notes.append(
        f"replay check: {sum(matches)}/{len(expected)} observations match the recording"
        + (
            f" ({len(expected) - len(observed)} not replayed: the episode ended)"
            if len(observed) < len(expected)
            else ""
        )
    )
