"""AWM scenarios as a TRL ``environment_factory`` (online GRPO / ECHO against live environments).

TRL's contract (``trl.GRPOTrainer``, 1.16): the factory returns an instance; every public
*function defined on the instance's class* except ``reset`` and ``get_reward`` is a tool, named
by ``__name__`` and described to the model by ``transformers.utils.get_json_schema``
(:mod:`~echo_trl.envs.awm.online.tools` builds those methods). ``reset(**row)`` gets the dataset row and may
return text appended to the last user message; ``get_reward()`` scores the finished rollout. TRL
makes one instance per concurrent rollout and reuses (resets) them across batches. A ``dict``
of factories routes each row by its ``environment`` column (TRL's multi-environment mode).

:func:`awm_environment_factory` (one scenario) and :func:`awm_environment_factories` (many, one
factory per scenario, rows routed by their ``scenario``) build a class per scenario whose
methods are generated from each MCP tool's ``inputSchema`` (a call forwards to the tool);
:func:`~echo_trl.envs.awm.online.dataset.awm_task_dataset` makes the rows.
Instances hold no server: every episode runs on a :class:`~echo_trl.envs.awm.runtime.pool.ServerPool`
session with its own database copy, servers start lazily and at most ``max_servers`` live at
once (least recently used closed first). The class declares ``concurrent_rollouts``: its instances share
no mutable state, so ``EchoGRPOTrainer`` runs a batch's tool calls and verifications in threads
(:mod:`echo_trl.train.online.rollout_threads`); ``reset`` starts the scenario's servers ahead of them (up to one
per open episode, within ``max_servers``: :meth:`~echo_trl.envs.awm.runtime.pool.ServerPool.warm`).
The reward is the task verifier's (complete 1.0, ...)
or the format-error reward when the rollout made a format error (AWM: the rollout goes on, its
reward stays -1.0; ``stop_on_format_error`` ends it at the first one instead).

``verify_turn``: ``env_output`` (default) adds a ``verify(final_answer)`` tool, so the agent
ends the episode itself and the verifier's result enters the conversation as a tool output
(what OpenEnv's RFC 010 example trains on); ``omit`` keeps the verifier out of the conversation
(``get_reward`` runs it, the policy never sees it, as in the official AWM agent; its
``raw_result`` can reveal the answer). ``get_reward`` verifies a rollout that did not.

What the ECHO trainer gets from an instance (all private, so TRL does not expose them as tools):
``_episode`` (the live :class:`Episode`: ``steps`` with each observation exactly as the model
saw it, ``reward_type``), ``_episode_record()`` (the OpenEnv capture shape, for logging or
``build-dataset``), ``_pool``. The tool result strings returned to TRL are byte-identical to
the ``tool_result`` / ``error`` observations, so TRL's ``tool_mask`` marks exactly the env-output
text the ECHO world-model loss trains on.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ....data.readers.formats import VERIFY_TURNS
from ....data.readers.tools import serialize_output
from ..check.usable import ScenarioReport, screen_scenarios
from ..runtime.episode import Episode
from ..runtime.pool import ServerPool
from ..runtime.settings import AWMSettings
from ..scenario.source import Scenario, ScenarioError, ScenarioSource
from .tools import make_tool_method, tool_identifier


class AWMEnvironment:
    """Base of the generated per-scenario environment classes (see the module docstring)."""

    _scenario: Scenario
    _tools: list[dict[str, Any]]
    _pool: ServerPool
    _default_task_idx: int | None = None
    _settings: AWMSettings = AWMSettings()
    _unusable_tasks: dict[tuple[str, int], str] = {}  # (scenario, task_idx) -> why, from a scenario report
    #: Rollouts are independent (own pool session and database; the pool is thread-safe; ``get_reward`` returns
    #: the verdict of its first call again): ``EchoGRPOTrainer`` may run their tool calls and rewards in threads.
    concurrent_rollouts = True

    def __init__(self) -> None:
        self._episode: Episode | None = None
        self._task_idx: int | None = None
        weakref.finalize(self, _close_episode, self.__dict__)

    def reset(self, **kwargs: Any) -> str | None:
        """Start a rollout on a fresh copy of the scenario's initial database.

        The task comes from the dataset row's ``task_idx`` (or the factory's default task); a
        row's ``scenario`` must be this environment's. Returns the task text when the row's
        prompt does not already carry it.
        """
        scenario = self._row_scenario(kwargs.get("scenario"))
        task_idx = kwargs.get("task_idx", self._default_task_idx)
        if task_idx is None:
            raise ValueError(
                "AWM environment: the dataset row needs a 'task_idx' column (or pass task_idx= to "
                "awm_environment_factory)"
            )
        self._task_idx = int(task_idx)
        why = self._unusable_tasks.get((scenario, self._task_idx))
        if why is not None:
            raise ValueError(
                f"AWM environment: task {self._task_idx} of scenario {scenario!r} is unusable per the scenario "
                f"report ({why}); leave it out of the prompts (awm_task_dataset(..., scenario_report=...)) or pass "
                "include_unusable=True to the factory"
            )
        _close_episode(self.__dict__)
        self._episode = self._pool.new_episode(
            scenario, self._task_idx, format_error_ends_episode=self._settings.stop_on_format_error
        )
        self._pool.warm(scenario)  # the batch's servers start while the model writes its first turn
        prompt = kwargs.get("prompt")
        last = prompt[-1].get("content") if isinstance(prompt, list) and prompt else prompt
        return None if isinstance(last, str) and last.strip() else self._episode.task

    def _row_scenario(self, scenario: str | None) -> str:
        """The scenario a row runs in: this class's (a row naming another one is routed wrongly)."""
        if scenario is not None and scenario != self._scenario.name:
            raise ValueError(
                f"AWM environment for scenario {self._scenario.name!r} got a row of scenario {scenario!r} "
                "(route rows with awm_environment_factories and an 'environment' column)"
            )
        return self._scenario.name

    def _call(self, tool_name: str, arguments: dict[str, Any]) -> str:
        if self._episode is None:
            raise RuntimeError("AWM environment: reset() was not called")
        obs = self._episode.call_tool(tool_name, arguments)
        return obs["tool_result"] if "tool_result" in obs else obs.get("error", "")

    def _verify(self, final_answer: str | None = None) -> str:
        if self._episode is None:
            raise RuntimeError("AWM environment: reset() was not called")
        obs = self._episode.verify(final_answer)
        return serialize_output(obs["verify_result"]) if "verify_result" in obs else obs.get("error", "")

    def get_reward(self) -> float:
        """Verify the final database; the format-error reward instead if the rollout made one."""
        ep = self._episode
        if ep is None:
            return self._pool.rewards.other
        if not ep.done:
            ep.verify()
        reward = ep.reward if self._settings.format_error_penalty else ep.verifier_reward
        return float(reward if reward is not None else self._pool.rewards.other)

    def _episode_record(self) -> dict[str, Any] | None:
        return self._episode.record(self._settings.verify_turn) if self._episode is not None else None

    def _close(self) -> None:
        _close_episode(self.__dict__)


def _close_episode(state: dict[str, Any]) -> None:
    """Close an instance's episode (its database copy goes); a finalizer, so it takes the instance's dict."""
    episode = state.get("_episode")
    if episode is not None:
        episode.close()  # idempotent


def verify(self, final_answer: str | None = None) -> str:
    """Finish the task: check the environment's final state and end the episode.

    Call it once, when the task is done (or cannot be done); later tool calls are refused.

    Args:
        final_answer: Your final answer to the user, if the task asks for one.

    Returns:
        The verifier's result.
    """
    return self._verify(final_answer)


_instances: weakref.WeakSet[AWMEnvironment] = weakref.WeakSet()
_factory_pools: list[ServerPool] = []


def environment_class(
    pool: ServerPool,
    scenario: Scenario,
    settings: AWMSettings,
    *,
    task_idx: int | None = None,
    unusable_tasks: dict[tuple[str, int], str] | None = None,
) -> type[AWMEnvironment]:
    """The TRL environment class of ``scenario`` on ``pool`` (one method per MCP tool, + ``verify``)."""
    verify_turn = settings.verify_turn
    if verify_turn not in VERIFY_TURNS:
        raise ValueError(f"verify_turn must be one of {VERIFY_TURNS}, got {verify_turn!r}")
    pool.add(scenario)
    tools = pool.tools(scenario.name)
    taken: set[str] = set()
    methods: dict[str, Callable[..., str]] = {"verify": verify} if verify_turn == "env_output" else {}
    for tool in tools:
        name = tool_identifier(tool["name"], taken)
        methods[name] = make_tool_method(tool, name)
    return type(
        "AWMEnv_" + re.sub(r"\W", "_", scenario.name),
        (AWMEnvironment,),
        {
            **methods,
            "_scenario": scenario,
            "_tools": tools,
            "_pool": pool,
            "_default_task_idx": task_idx,
            "_settings": settings,
            "_unusable_tasks": dict(unusable_tasks or {}),
            "__doc__": f"AWM scenario {scenario.name!r} as a TRL environment ({len(tools)} MCP tools).",
        },
    )


def make_factory(cls: type[AWMEnvironment]) -> Callable[[], AWMEnvironment]:
    """The zero-argument factory TRL calls for ``cls``; its instances are closed by :func:`close_environments`."""

    def factory() -> AWMEnvironment:
        env = cls()
        _instances.add(env)
        return env

    factory.environment_class = cls  # type: ignore[attr-defined]
    return factory


def resolve_pool(pool: ServerPool | None, settings: AWMSettings) -> ServerPool:
    """``pool``, or a new one with ``settings`` that :func:`close_environments` stops."""
    if pool is not None:
        return pool
    pool = ServerPool(settings=settings)
    _factory_pools.append(pool)
    return pool


def awm_environment_factory(
    source: ScenarioSource | Scenario,
    scenario: str | None = None,
    *,
    task_idx: int | None = None,
    pool: ServerPool | None = None,
    settings: AWMSettings | None = None,
    scenario_report: ScenarioReport | dict[str, Any] | str | Path | None = None,
    include_unusable: bool = False,
    **options: Any,
) -> Callable[[], AWMEnvironment]:
    """A zero-argument factory for ``GRPOTrainer(environment_factory=...)`` (one scenario).

    ``settings`` (:class:`~echo_trl.envs.awm.runtime.settings.AWMSettings`); ``options`` change single
    fields of it: ``format_error_penalty``, ``rewards``, ``tool_timeout``, ``verifier_timeout``,
    ``verify_turn``, ``stop_on_format_error``, ``max_servers``, ``unsafe_no_sandbox`` ... Starts the
    scenario's first server now (its tools become the class's methods); instances share ``pool`` (a new
    one of ``max_servers`` when not given). ``close_environments()`` (or interpreter exit) stops
    everything. Generated code runs in the bwrap sandbox; ``unsafe_no_sandbox=True`` runs it uncontained
    (refused otherwise where no sandbox can be had). ``task_idx``: the task of rows without a ``task_idx``.
    ``scenario_report`` (``echo-trl check-scenarios``' report, or its path): a scenario it marks unusable is
    refused, and a row of a task it marks unusable (e.g. ``already_satisfied``) is refused at ``reset``, unless
    ``include_unusable``.
    """
    settings = (settings or AWMSettings()).replace(**options)
    sc = source if isinstance(source, Scenario) else source.load(scenario or "")
    kept, unusable = screen_scenarios([sc], scenario_report, include_unusable=include_unusable)
    if not kept:
        raise ScenarioError(
            "the scenario report marks it (or every task of it) unusable; include_unusable=True uses it anyway",
            scenario=sc.name,
        )
    cls = environment_class(resolve_pool(pool, settings), sc, settings, task_idx=task_idx, unusable_tasks=unusable)
    return make_factory(cls)


def awm_environment_factories(
    scenarios: Sequence[Scenario],
    *,
    pool: ServerPool | None = None,
    settings: AWMSettings | None = None,
    scenario_report: ScenarioReport | dict[str, Any] | str | Path | None = None,
    include_unusable: bool = False,
    **options: Any,
) -> dict[str, Callable[[], AWMEnvironment]]:
    """``{scenario name: factory}`` for TRL's multi-environment mode, all on one server pool.

    Rows choose their environment by their ``environment`` column, which
    :func:`~echo_trl.envs.awm.online.dataset.awm_task_dataset` sets to the row's ``scenario``. Each
    scenario's first server starts here (for its tool list) and is closed again when the pool needs room.
    ``settings`` and ``options`` as for :func:`awm_environment_factory`. ``scenario_report``: the scenarios it marks
    unusable (or whose every task is) are left out, with a logged warning naming them and why, and rows of the
    tasks it marks unusable are refused at ``reset``, unless ``include_unusable``.
    """
    settings = (settings or AWMSettings()).replace(**options)
    names = [sc.name for sc in scenarios]
    if len(set(names)) != len(names):
        raise ValueError(f"scenario names repeat: {names}")
    kept, unusable = screen_scenarios(scenarios, scenario_report, include_unusable=include_unusable)
    pool = resolve_pool(pool, settings)
    return {sc.name: make_factory(environment_class(pool, sc, settings, unusable_tasks=unusable)) for sc in kept}


def close_environments() -> None:
    """Stop every environment instance and server pool created by a factory in this process."""
    for env in list(_instances):
        env._close()
    while _factory_pools:
        _factory_pools.pop().close()
