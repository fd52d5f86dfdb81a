"""The official AWM agent's format, live: capture with a model and train online in it.

:mod:`echo_trl.data.awm_agent` holds the format (system prompt, ``list_tools`` reply, call parsing,
reply texts); this module carries out an agent's turns on a live episode with those functions:

* :func:`agent_reply`: one parsed action -> what the official agent's loop does and replies
  (``list_tools`` -> the tool listing; ``call_tool`` -> the MCP call with the ``mcp_tool_``
  prefix stripped and JSON-string arguments repaired, its text or ``Error: <text>``; any other
  name -> the official "Unknown tool" reply, recorded as a format error);
* :class:`AWMAgentModelPolicy`: ``capture --format awm-agent --policy model:PATH``: the official
  system prompt, no tool schemas in the chat template, each turn parsed with
  :func:`echo_trl.data.awm_agent.next_action` (its first ``<tool_call>`` block; further blocks are
  ignored, one call per turn; no readable call = the final answer, which goes to the verifier);
* :class:`AWMAgentEnvironment` (:func:`awm_agent_environment_factory`): a TRL environment with
  exactly two tools, ``list_tools`` and ``call_tool`` (the official names, descriptions and
  argument names), one class for every scenario: ``reset`` takes the row's ``scenario`` and
  runs the episode on the shared :class:`~echo_trl.envs.awm.pool.ServerPool`.

Online, TRL parses the calls with the chat template's own parser and passes all of a turn's
calls; ``call_tool`` then reads its arguments as the official agent does (an object or a JSON
string, repaired). The verifier never enters an awm-agent conversation online (``get_reward``
runs it after the rollout), as in the official agent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...data import awm_agent
from ...data.prompt import prompt_messages
from .environment import AWMEnvironment, make_factory, resolve_pool
from .episode import Episode
from .policy import ModelPolicy
from .pool import ServerPool
from .scenario import Scenario
from .verifier import RewardConfig


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


class AWMAgentModelPolicy(ModelPolicy):
    """A local model playing episodes in the official AWM agent's conversation (see the module docstring)."""

    def __post_init__(self) -> None:  # the official agent parses <tool_call> text itself: no TRL response schema
        if self.system_prompt is None:
            self.system_prompt = awm_agent.SYSTEM_PROMPT

    def play(self, episode: Episode, episode_index: int = 0) -> None:
        messages = prompt_messages(self.system_prompt, episode.scenario, episode.task)
        episode.behavior_logprobs = []
        for _ in range(self.max_steps):
            _, ids, logprobs = self._generate(messages, None)
            episode.behavior_logprobs.extend(logprobs)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            policy = {"text": text, "token_ids": ids, "logprobs": logprobs}
            action = awm_agent.next_action(text)
            if action.kind == "final":
                episode.verify(final_answer=text.strip())
                episode.steps[-1]["policy"] = policy
                return
            reply = agent_reply(episode, action, extra={"policy": policy})
            messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": reply}]
            if episode.done:
                return
        episode.notes.append(f"max_steps={self.max_steps} reached")
        episode.verify()


class AWMAgentEnvironment(AWMEnvironment):
    """TRL environment in the official agent's format: exactly ``list_tools`` and ``call_tool``."""

    _verify_turn = "omit"

    def _row_scenario(self, scenario: str | None) -> str:
        if scenario is None:
            raise ValueError("AWM agent environment: the dataset row needs a 'scenario' column")
        self._pool.scenario(scenario)  # a clear error for a scenario the factory was not given
        return scenario

    def list_tools(self) -> str:
        return self._act(awm_agent.action_for_call(awm_agent.LIST_TOOLS))

    def call_tool(self, tool_name: str, arguments: str) -> str:
        return self._act(
            awm_agent.action_for_call(awm_agent.CALL_TOOL, {"tool_name": tool_name, "arguments": arguments})
        )

    def _act(self, action: awm_agent.AgentAction) -> str:
        if self._episode is None:
            raise RuntimeError("AWM environment: reset() was not called")
        return agent_reply(self._episode, action)


# The tool descriptions TRL renders come from these docstrings: the official texts, word for word.
AWMAgentEnvironment.list_tools.__doc__ = (
    f"{awm_agent.LIST_TOOLS_DESCRIPTION}\n\nReturns:\n    A list of MCP "
    "environment-specific tools and their descriptions"
)
AWMAgentEnvironment.call_tool.__doc__ = (
    f"{awm_agent.CALL_TOOL_DESCRIPTION}\n\nArgs:\n    tool_name: {awm_agent.TOOL_NAME_DESCRIPTION}\n    arguments: "
    f"{awm_agent.ARGUMENTS_DESCRIPTION}\n\nReturns:\n    The result of the <tool_name> tool call"
)


def awm_agent_environment_factory(
    scenarios: Sequence[Scenario],
    *,
    format_error_penalty: bool = True,
    rewards: RewardConfig | None = None,
    tool_timeout: float = 30.0,
    verifier_timeout: float = 30.0,
    verify_turn: str = "omit",
    stop_on_format_error: bool = False,
    pool: ServerPool | None = None,
    max_servers: int = 4,
    unsafe_no_sandbox: bool = False,
) -> Callable[[], AWMAgentEnvironment]:
    """One factory for every scenario (rows choose by their ``scenario`` column); nothing starts until used."""
    if verify_turn != "omit":
        raise ValueError(
            "the awm-agent environment has exactly list_tools and call_tool, so the verifier cannot "
            "enter the conversation online: use verify_turn='omit' (get_reward runs it)"
        )
    pool = resolve_pool(
        pool,
        max_servers,
        rewards=rewards,
        tool_timeout=tool_timeout,
        verifier_timeout=verifier_timeout,
        unsafe_no_sandbox=unsafe_no_sandbox,
    )
    for sc in scenarios:
        pool.add(sc)
    cls = type(
        "AWMAgentEnv",
        (AWMAgentEnvironment,),
        {
            "_pool": pool,
            "_format_error_penalty": format_error_penalty,
            "_stop_on_format_error": stop_on_format_error,
            "__doc__": f"AWM scenarios {sorted(sc.name for sc in scenarios)} in the official agent's format.",
        },
    )
    return make_factory(cls)
