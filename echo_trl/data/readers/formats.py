"""The conversation formats a recorded episode can be built in, and where its verifier step goes.

``chat-template`` gives the scenario's tools to the model's own chat template; ``awm-agent`` is the official
AWM agent's ``list_tools`` / ``call_tool`` conversation (:mod:`echo_trl.data.readers.awm_agent`).
"""

from __future__ import annotations

from typing import Any

from ...errors import EpisodeError

__all__ = ["FORMATS", "VERIFY_TURNS", "default_verify_turn", "captured_format", "build_format"]

#: Conversation formats a recorded episode can be rendered in (see ``docs/datasets.md``).
FORMATS = ("chat-template", "awm-agent")
#: How the verifier step enters the conversation: as an ``env_output`` message, or not at all.
VERIFY_TURNS = ("env_output", "omit")


def default_verify_turn(format: str) -> str:
    """``omit`` for the official agent's format (it never shows the verifier), else ``env_output``."""
    return "omit" if format == "awm-agent" else "env_output"


def captured_format(episode: Any) -> str | None:
    """The format ``echo-trl capture`` recorded an episode in (``metadata.format``), or ``None`` where the record
    names none (other collectors, AWM's own trajectories). A value that is not a format is the record's error."""
    metadata = episode.get("metadata") if isinstance(episode, dict) else None
    recorded = metadata.get("format") if isinstance(metadata, dict) else None
    if recorded is None or recorded in FORMATS:
        return recorded
    raise EpisodeError(f"{recorded!r} is not a format (expected one of {', '.join(FORMATS)})", field="metadata.format")


def build_format(episode: Any, format: str | None) -> str:
    """The format an episode is built in: ``format`` when one is asked for, else the one it was captured in
    (``chat-template`` where it records none). The sampler's ``behavior_logprobs`` belong to the conversation
    the episode was captured in: built in another format they would be counted against other action tokens, so
    that is refused for the record, naming both formats."""
    captured = captured_format(episode)
    chosen = format or captured or "chat-template"
    if captured is not None and chosen != captured and episode.get("behavior_logprobs") is not None:
        raise EpisodeError(
            f"the sampler's log-probs are those of the {captured} conversation this episode was captured in, not "
            f"of the {chosen} one asked for: build it with --format {captured} (the default), or without the field "
            "(the trainer's behavior_policy stands in)",
            field="behavior_logprobs",
        )
    return chosen
