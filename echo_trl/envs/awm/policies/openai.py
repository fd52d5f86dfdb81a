"""Play AWM episodes with a model behind an OpenAI-compatible server (``--policy openai:URL``).

:class:`OpenAIPolicy` is the episode loop in either conversation format; each turn is sampled through
:class:`~echo_trl.clients.openai.OpenAIClient` and read with
:func:`~echo_trl.envs.awm.policies.sampled.sampled_turn`. The live conversation is built with the
functions the dataset builder renders the recording with, so the prompt of every turn is the one the
trainer sees: chat-template (the scenario's tools as the API's ``tools``, one assistant message per
tool call, the server's parsed ``tool_calls``) or awm-agent (the official agent's system prompt, no
``tools``, each turn's text parsed with :func:`echo_trl.data.readers.awm_agent.next_action`, replies from
:func:`~echo_trl.envs.awm.runtime.agent_turns.agent_reply`). A request the server refuses as too long
ends that episode (noted), so does a response the client or :func:`sampled_turn` cannot use (over the size
cap, not strict JSON, a malformed field); a server failing after the client's retries stops the run (finished episodes
are kept).

Every turn is kept in the record under ``sampler.turns`` (in generation order; ``play`` returns
them); aligning them with the trainer's tokenization into ``behavior_logprobs`` needs the tokenizer,
so it happens outside ``envs/`` (``echo_trl.tokens.sampled``).
"""

from __future__ import annotations

import contextlib
import json
import zlib
from dataclasses import dataclass
from typing import Any

from ....clients.openai import BadResponse, OpenAIClient, RequestRefused
from ....data.readers import awm_agent
from ....data.readers.prompt import DEFAULT_SYSTEM_PROMPT, prompt_messages
from ....io import strict_json
from ....redact import redact
from ....roles import Message, tool_call
from ..runtime.agent_turns import agent_reply
from ..runtime.episode import Episode
from .policy import PolicyError, live_prompt, observation_text
from .sampled import SampledTurn, sampled_turn


def api_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Conversation messages in the API's shape: tool-call arguments as JSON text with ids, tool replies
    pointing at them (the server turns the arguments back into objects for the chat template)."""
    out, ids = [], []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [f"call_{len(out)}_{j}" for j in range(len(m["tool_calls"]))]
            calls = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])},
                }
                for cid, c in zip(ids, m["tool_calls"], strict=True)
            ]
            out.append({"role": "assistant", "content": m.get("content") or "", "tool_calls": calls})
        elif m["role"] == "tool":
            out.append({"role": "tool", "content": m["content"], "tool_call_id": ids.pop(0) if ids else "call"})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def episode_seed(seed: int, scenario: str, task_idx: int | None, index: int) -> int:
    """A per-episode sampling seed: the same episode gets the same seed on every run (and a resumed one)."""
    return (seed * 1_000_003 + zlib.crc32(f"{scenario}/{task_idx}/{index}".encode())) % (2**31)


@dataclass
class OpenAIPolicy:
    """Samples each turn from an OpenAI-compatible server (see the module docstring)."""

    client: OpenAIClient
    format: str = "chat-template"
    max_steps: int = 8
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT  # the dataset builder's default; awm-agent: the official one
    seed: int | None = 0

    def stop(self) -> None:
        """The run was stopped: end the requests in flight now (their episodes raise) and send no other."""
        self.client.stop()

    def play(self, episode: Episode, episode_index: int = 0) -> list[dict[str, Any]]:
        """Play ``episode``; returns its sampled turns in order (the collector records them as ``sampler.turns``)."""
        turns: list[dict[str, Any]] = []
        seed = self.seed
        if seed is not None:
            seed = episode_seed(seed, episode.scenario, episode.task_idx, episode_index)
        agent = self.format == "awm-agent"
        if agent:
            system = awm_agent.SYSTEM_PROMPT if self.system_prompt == DEFAULT_SYSTEM_PROMPT else self.system_prompt
            messages = prompt_messages(system, episode.scenario, episode.task)
            tools = None
        else:
            messages, tools = live_prompt(self.system_prompt, episode)
        for step in range(self.max_steps):
            body: dict[str, Any] = {
                "messages": api_messages(messages),
                "temperature": self.temperature,
                "top_p": self.top_p,
                "max_tokens": self.max_tokens,
            }
            if tools:
                body["tools"] = tools
            if seed is not None:
                body["seed"] = seed + step
            try:
                turn = sampled_turn(self.client.complete(body))
            except (RequestRefused, BadResponse, PolicyError) as exc:  # this episode's response: the run goes on
                episode.notes.append(redact(f"policy stopped: {exc}"))
                break
            turns.append(turn.to_json())
            ended = self._agent_turn(episode, turn, messages) if agent else self._tool_turn(episode, turn, messages)
            if ended:
                return turns
        else:
            episode.notes.append(f"max_steps={self.max_steps} reached")
        if not episode.done:
            episode.verify()
        return turns

    def _tool_turn(self, episode: Episode, turn: SampledTurn, messages: list[Message]) -> bool:
        """Chat-template: each tool call a step (and an assistant message of its own, as the dataset renders it)."""
        if not turn.tool_calls:
            episode.verify(final_answer=turn.content)
            return True
        for call in turn.tool_calls:
            args: Any = call["arguments"]
            with contextlib.suppress(ValueError):  # not strict JSON: kept as text (invalid arguments, as in AWM)
                args = strict_json.scrub(strict_json.loads(args))[0] if args.strip() else {}
            obs = episode.call_tool(call["name"] or "<missing tool name>", args)
            action = episode.steps[-1]["action"]  # as recorded (what the dataset renders)
            name = action["tool_name"]
            messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call(name, action["arguments"])]})
            messages.append({"role": "tool", "name": name, "content": observation_text(obs)})
            if obs.get("done"):
                return True
        return False

    def _agent_turn(self, episode: Episode, turn: SampledTurn, messages: list[Message]) -> bool:
        """awm-agent: the turn's first ``<tool_call>`` as the official agent reads it; the reply as it shows it."""
        action = awm_agent.next_action(turn.content)
        if action.kind == "final":
            episode.verify(final_answer=turn.content.strip())
            return True
        reply = agent_reply(episode, action)
        if action.kind == "list_tools":
            messages.append(awm_agent.list_tools_message())
            messages.append({"role": "tool", "name": awm_agent.LIST_TOOLS, "content": reply})
        else:
            name = action.tool_name if action.kind == "call_tool" else action.name
            messages.append(awm_agent.call_tool_message(name, action.arguments))
            messages.append({"role": "tool", "name": awm_agent.CALL_TOOL, "content": reply})
        return episode.done
