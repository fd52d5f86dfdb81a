"""Any recorded episode as a trajectory: which reader a record goes to, and whole inputs at once.

A record is a conversation log (``messages`` + ``reward``; :mod:`echo_trl.data.readers.conversations`) or a
recorded AWM episode (``steps`` or ``trajectory``; :mod:`echo_trl.data.readers.awm`). Finding files and
reading their raw records is :mod:`echo_trl.data.readers.episode_files`; this module sends each record to its
reader and places every error at its file and record, so the readers never need one another.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import EpisodeError
from ...progress import progress
from ...roles import Trajectory
from .awm import awm_record_to_trajectory
from .conversations import conversation_to_trajectory
from .episode_files import EpisodeRecord, iter_episode_records
from .fields import check_text
from .formats import FORMATS, VERIFY_TURNS, build_format, default_verify_turn
from .prompt import DEFAULT_SYSTEM_PROMPT

__all__ = ["awm_episode_to_trajectory", "iter_awm_trajectories", "load_awm_episodes"]


@dataclass(frozen=True)
class SkippedRecord:
    """A record lenient loading left out, and why (written to ``skipped.jsonl``)."""

    source: str
    record: str
    reason: str
    raw: Any

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "record": self.record, "reason": self.reason, "raw": self.raw}

    def to_jsonl(self) -> str:
        """One ``skipped.jsonl`` line, for any record: text that is not valid Unicode is escaped
        (``\\ud800``), a value too deep to write again is left out (its reason says why)."""
        try:
            line = json.dumps(self.to_json(), ensure_ascii=False)
        except (RecursionError, ValueError, TypeError):
            return json.dumps({**self.to_json(), "raw": None}, ensure_ascii=True)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(self.to_json(), ensure_ascii=True)
        return line


def token_ids_hash(ids: list[int]) -> str:
    """How a recorded sampler turn names the prompt the server tokenized (``prompt_tokens.sha256``): a short
    hash of the token ids, compared with the trainer's own tokens without storing thousands of ids per turn."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def sampled_turns(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The turns a policy sampled for a recorded episode, in order: ``sampler.turns`` (``capture --policy openai:``),
    else the ``policy`` entries of its steps (``--policy model:``); each may hold ``token_ids`` and ``logprobs``."""
    sampler = record.get("sampler")
    if isinstance(sampler, dict) and isinstance(sampler.get("turns"), list):
        return sampler["turns"]
    steps = [*(record.get("steps") or []), *([record["verification"]] if "verification" in record else [])]
    return [s["policy"] for s in steps if isinstance(s, dict) and isinstance(s.get("policy"), dict)]


def is_conversation(record: Any) -> bool:
    """A conversation log rather than a recorded AWM episode (``steps`` / ``trajectory``)."""
    return isinstance(record, dict) and "messages" in record and not {"steps", "trajectory"} & record.keys()


def awm_episode_to_trajectory(
    episode: Any,
    *,
    source: str = "<episode>",
    record: str | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
    format: str | None = None,
    verify_turn: str | None = None,
) -> Trajectory:
    """Map one recorded AWM episode (either shape) onto a role-tagged :class:`Trajectory`.

    System prompt and task become the prompt (``context``); each step becomes an assistant
    message with one tool call (``action``) followed by a ``tool`` message holding the tool
    result, error or verifier output (``env_output``). Harness warnings go to
    ``Trajectory.warnings``, never into the tool message text. ``compact_tools`` drops the
    response documentation from tool descriptions (:func:`echo_trl.data.readers.tools.compact_tool_schema`).
    Raises :class:`EpisodeError` naming ``source``, ``record`` and the offending field.

    ``format="awm-agent"``: the official AWM agent's conversation (:mod:`echo_trl.data.readers.awm_agent`);
    ``None``: the format the episode was captured in (:func:`record_format`). ``verify_turn`` (``env_output`` |
    ``omit``, default per format) keeps or drops the verifier step (dropped: a recorded final answer ends the
    chat). A record with ``messages`` (a conversation log) is read as recorded by
    :mod:`echo_trl.data.readers.conversations`.
    """
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})")
    if verify_turn not in (None, *VERIFY_TURNS):
        raise ValueError(f"unknown verify_turn {verify_turn!r} (expected one of {', '.join(VERIFY_TURNS)})")
    if compact_tools and format == "awm-agent":
        raise ValueError(
            "compact_tools applies to the chat-template format (awm-agent lists tools as the official agent does)"
        )
    try:
        check_text(episode)
        if is_conversation(episode):
            return conversation_to_trajectory(episode, source=source, record_id=record)
        chosen = build_format(episode, format)
        if compact_tools and chosen == "awm-agent":
            raise EpisodeError(
                "captured as awm-agent, which lists the tools as the official agent does: compact tools apply to "
                "chat-template episodes (ask for that format to build it so)",
                field="metadata.format",
            )
        return awm_record_to_trajectory(
            episode,
            system_prompt=system_prompt,
            compact_tools=compact_tools,
            format=chosen,
            verify_turn=verify_turn or default_verify_turn(chosen),
        )
    except EpisodeError as exc:
        raise exc.at(source=source, record=record) from None
    except (RecursionError, OverflowError, TypeError, ValueError) as exc:
        # A backstop: content the checks above did not foresee is still this record's error.
        raise EpisodeError(f"cannot convert ({type(exc).__name__}: {exc})", source=source, record=record) from None


def record_format(episode: Any, format: str | None) -> str:
    """The format a record is built in: a conversation log is taken as recorded (``format``, else
    ``chat-template``, names it); an AWM episode in ``format``, else the one it was captured in
    (:func:`~echo_trl.data.readers.formats.build_format`)."""
    if is_conversation(episode):
        return format or "chat-template"
    return build_format(episode, format)


def load_awm_episodes(
    inputs: Iterable[str | Path],
    *,
    strict: bool = True,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
    show_progress: bool | None = False,
    check: Callable[[Trajectory], None] | None = None,
    format: str | None = None,
    verify_turn: str | None = None,
) -> tuple[list[Trajectory], list[SkippedRecord]]:
    """Read and convert every episode under ``inputs``.

    ``strict=True`` raises the first :class:`EpisodeError`; ``strict=False`` keeps every valid
    episode and returns the rejected records with their reasons (nothing valid is lost).
    ``check`` runs on each converted trajectory inside its record's error handling (the dataset
    builder passes its Arrow encoder), so an :class:`EpisodeError` it raises names this record.
    Input that yields no episode at all is an error in both modes.
    ``format`` and ``verify_turn``: see :func:`awm_episode_to_trajectory`.
    All in memory: :func:`iter_awm_trajectories` streams them (what the dataset builder uses).
    """
    inputs = list(inputs)
    skipped: list[SkippedRecord] = []
    records = progress(iter_episode_records(inputs), desc="episodes", unit="ep", enable=show_progress)
    options = {"system_prompt": system_prompt, "compact_tools": compact_tools, "format": format}
    checked = None if check is None else lambda trajectory, _format: check(trajectory)
    converted = iter_awm_trajectories(
        records, strict=strict, on_skip=skipped.append, check=checked, verify_turn=verify_turn, **options
    )
    trajectories = [t for t, _ in converted]
    if not trajectories:
        raise no_valid_episodes(inputs, len(skipped), skipped[0].reason if skipped else None)
    return trajectories, skipped


def no_valid_episodes(inputs: list, n_skipped: int, first_reason: str | None) -> EpisodeError:
    """The error of input that yields no episode at all (both modes)."""
    where = ", ".join(map(str, inputs)) or "<no inputs>"
    detail = f"all {n_skipped} record(s) are invalid; first: {first_reason}" if n_skipped else "no episode records"
    return EpisodeError(f"no valid episodes ({detail})", source=where)


def iter_awm_trajectories(
    records: Iterable[EpisodeRecord],
    *,
    strict: bool = True,
    on_skip: Callable[[SkippedRecord], None] | None = None,
    check: Callable[[Trajectory, str], Any] | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
    format: str | None = None,
    verify_turn: str | None = None,
) -> Iterator[tuple[Trajectory, Any]]:
    """Each valid record of ``records`` as ``(trajectory, check(trajectory, its format))``, one at a time (nothing
    kept; the format is the one it was built in, :func:`record_format`).

    ``check`` runs inside the record's error handling (an :class:`EpisodeError` it raises names the record);
    ``strict`` raises the first error, else each rejected record goes to ``on_skip``.
    """
    for rec in records:
        try:
            if rec.error is not None:
                raise rec.error
            trajectory = awm_episode_to_trajectory(
                rec.data,
                source=rec.source,
                record=rec.record or None,
                system_prompt=system_prompt,
                compact_tools=compact_tools,
                format=format,
                verify_turn=verify_turn,
            )
            checked = check(trajectory, record_format(rec.data, format)) if check is not None else None
        except EpisodeError as exc:
            exc = exc.at(source=rec.source, record=rec.record or None)
            if strict:
                raise exc from None
            if on_skip is not None:
                on_skip(SkippedRecord(rec.source, rec.record, str(exc), rec.data if rec.error is None else rec.raw))
            continue
        yield trajectory, checked
