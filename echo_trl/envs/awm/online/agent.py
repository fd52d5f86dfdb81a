"""The official AWM agent's format as a TRL environment: exactly ``list_tools`` and ``call_tool``.

:class:`AWMAgentEnvironment` (:func:`awm_agent_environment_factory`): a TRL environment with exactly
two tools, ``list_tools`` and ``call_tool`` (the official names, descriptions and argument names), one
class for every scenario: ``reset`` takes the row's ``scenario`` and runs the episode on the shared
:class:`~echo_trl.envs.awm.runtime.pool.ServerPool`; each action is carried out and answered by
:func:`~echo_trl.envs.awm.runtime.agent_turns.agent_reply`.

Online, TRL parses the calls with the chat template's own parser and passes all of a turn's
calls; ``call_tool`` then reads its arguments as the official agent does (an object or a JSON
string, repaired). The verifier never enters an awm-agent conversation online (``get_reward``
runs it after the rollout), as in the official agent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ....data.readers import awm_agent
from ..check.usable import ScenarioReport, screen_scenarios
from ..runtime.agent_turns import agent_reply
from ..runtime.pool import ServerPool
from ..runtime.settings import AWMSettings
from ..scenario.source import Scenario
from .environment import AWMEnvironment, make_factory, resolve_pool


class AWMAgentEnvironment(AWMEnvironment):
    """TRL environment in the official agent's format: exactly ``list_tools`` and ``call_tool``."""

    _settings = AWMSettings(verify_turn="omit")

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
    pool: ServerPool | None = None,
    settings: AWMSettings | None = None,
    scenario_report: ScenarioReport | dict[str, Any] | str | Path | None = None,
    include_unusable: bool = False,
    **options: Any,
) -> Callable[[], AWMAgentEnvironment]:
    """One factory for every scenario (rows choose by their ``scenario`` column); nothing starts until used.

    ``settings`` and ``options`` as for :func:`~echo_trl.envs.awm.online.environment.awm_environment_factory`;
    ``verify_turn`` is ``omit`` here (the only one this environment can have). ``scenario_report`` and
    ``include_unusable`` as for :func:`~echo_trl.envs.awm.online.environment.awm_environment_factories`.
    """
    settings = (settings or AWMSettings()).replace(**{"verify_turn": "omit", **options})
    if settings.verify_turn != "omit":
        raise ValueError(
            "the awm-agent environment has exactly list_tools and call_tool, so the verifier cannot "
            "enter the conversation online: use verify_turn='omit' (get_reward runs it)"
        )
    scenarios, unusable = screen_scenarios(scenarios, scenario_report, include_unusable=include_unusable)
    pool = resolve_pool(pool, settings)
    for sc in scenarios:
        pool.add(sc)
    cls = type(
        "AWMAgentEnv",
        (AWMAgentEnvironment,),
        {
            "_pool": pool,
            "_settings": settings,
            "_unusable_tasks": unusable,
            "__doc__": f"AWM scenarios {sorted(sc.name for sc in scenarios)} in the official agent's format.",
        },
    )
    return make_factory(cls)
