"""The official AWM agent's actions carried out on a live episode, and the replies it shows the model.

:mod:`echo_trl.data.readers.awm_agent` holds the format (system prompt, ``list_tools`` reply, call parsing,
reply texts); :func:`agent_reply` carries out one parsed action with those functions, as the official
agent's loop does: ``list_tools`` -> the tool listing; ``call_tool`` -> the MCP call with the
``mcp_tool_`` prefix stripped and JSON-string arguments repaired, its text or ``Error: <text>``; any
other name -> the official "Unknown tool" reply, recorded as a format error. The capture policies
(:mod:`~echo_trl.envs.awm.policies`) and the two-tool TRL environment
(:mod:`~echo_trl.envs.awm.online.agent`) both answer the model with it.
"""

from __future__ import annotations

from typing import Any

from ....data.readers import awm_agent
from .episode import Episode


def agent_reply(episode: Episode, action: awm_agent.AgentAction, *, extra: dict[str, Any] | None = None) -> str:
    """Carry out one agent action on ``episode``; the reply the official agent shows the model."""
    if action.kind == "list_tools":
        episode.notes.append("list_tools")
        return awm_agent.list_tools_reply(episode.runtime.tools)
    if action.kind == "unknown":
        text = awm_agent.unknown_tool_text(action.name)
        episode.call_tool(action.name, {}, extra=extra, refuse=text[len(awm_agent.ERROR_PREFIX) :])
        return text
    obs = episode.call_tool(action.tool_name, action.arguments, extra=extra)
    if obs.get("reward_type") == "timeout":
        return awm_agent.timeout_text(episode.runtime.tool_timeout)
    if "tool_result" in obs:
        return obs["tool_result"]
    return awm_agent.error_text(obs.get("error", ""))
