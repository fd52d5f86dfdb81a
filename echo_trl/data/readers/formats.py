"""The conversation formats a recorded episode can be built in, and where its verifier step goes.

``chat-template`` gives the scenario's tools to the model's own chat template; ``awm-agent`` is the official
AWM agent's ``list_tools`` / ``call_tool`` conversation (:mod:`echo_trl.data.readers.awm_agent`).
"""

from __future__ import annotations

__all__ = ["FORMATS", "VERIFY_TURNS", "default_verify_turn"]

#: Conversation formats a recorded episode can be rendered in (see ``docs/datasets.md``).
FORMATS = ("chat-template", "awm-agent")
#: How the verifier step enters the conversation: as an ``env_output`` message, or not at all.
VERIFY_TURNS = ("env_output", "omit")


def default_verify_turn(format: str) -> str:
    """``omit`` for the official agent's format (it never shows the verifier), else ``env_output``."""
    return "omit" if format == "awm-agent" else "env_output"
