"""AWM scenarios as a TRL ``environment_factory`` (online GRPO / ECHO against live environments).

TRL's contract (``trl.GRPOTrainer``, 1.16): the factory returns an instance; every public
*function defined on the instance's class* except ``reset`` and ``get_reward`` is a tool, named
by ``__name__`` and described to the model by ``transformers.utils.get_json_schema`` (type hints +
Google docstring; it reads neither signature defaults nor schema keywords, so each argument's
description carries the MCP schema's ``(default: ...)`` and ``(choices: [...])``, the one form
``get_json_schema`` turns back into an ``enum``). ``reset(**row)`` gets the dataset row and may
return text appended to the last user message; ``get_reward()`` scores the finished rollout. TRL
makes one instance per concurrent rollout and reuses (resets) them across batches. A ``dict``
of factories routes each row by its ``environment`` column (TRL's multi-environment mode).

:func:`awm_environment_factory` (one scenario) and :func:`awm_environment_factories` (many, one
factory per scenario, rows routed by their ``scenario``) build a class per scenario whose
methods are generated from each MCP tool's ``inputSchema`` (a call forwards to the tool).
Instances hold no server: every episode runs on a :class:`~echo_trl.envs.awm.pool.ServerPool`
session with its own database copy, servers start lazily and at most ``max_servers`` live at
once (least recently used closed first). The reward is the task verifier's (complete 1.0, ...)
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

import inspect
import json
import keyword
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ...data.formats import VERIFY_TURNS
from ...data.prompt import DEFAULT_SYSTEM_PROMPT, prompt_messages
from ...data.tools import serialize_output
from .episode import Episode
from .pool import ServerPool
from .scenario import Scenario, ScenarioSource
from .verifier import RewardConfig

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


def _hint(schema: dict[str, Any]) -> Any:
    """A Python type hint for a JSON schema (what ``get_json_schema`` turns back into JSON schema)."""
    if not isinstance(schema, dict):
        return str
    t = schema.get("type")
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(t, list):
        options = [{"type": x} for x in t]
    if options:
        hints = [_hint(o) for o in options if isinstance(o, dict) and o.get("type") != "null"]
        nullable = any(isinstance(o, dict) and o.get("type") == "null" for o in options)
        base = hints[0] if len(set(hints)) == 1 else str
        return base | None if nullable else base
    if t == "array":
        item = _hint(schema.get("items", {})) if isinstance(schema.get("items"), dict) else None
        return list[item] if item in (str, int, float, bool) else list
    return _JSON_TYPES.get(t, str)


def _identifier(name: str, taken: set[str]) -> str:
    ident = re.sub(r"\W", "_", name)
    if (
        not ident
        or ident[0].isdigit()
        or keyword.iskeyword(ident)
        or ident.startswith("_")
        or ident in ("reset", "get_reward", "self", "verify")
    ):
        ident = f"tool_{ident.lstrip('_')}"
    while ident in taken:
        ident += "_"
    taken.add(ident)
    return ident


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no description)"


def argument_doc(prop: dict[str, Any], fallback: str) -> str:
    """One argument's docstring text: its description plus the schema facts ``get_json_schema`` can carry.

    ``(default: ...)`` keeps the MCP schema's default in the description the model reads;
    ``(choices: [...])`` last, because ``get_json_schema`` turns exactly that suffix into ``enum``.
    """
    text = _one_line(prop.get("description") or prop.get("title") or fallback)
    if "default" in prop:
        text += f" (default: {json.dumps(prop['default'], ensure_ascii=False)})"
    enum = prop.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, (str, int, float, bool)) for v in enum):
        text += f" (choices: {json.dumps(enum, ensure_ascii=False)})"
    return text


def make_tool_method(tool: dict[str, Any], method_name: str) -> Callable[..., str]:
    """A method with a real signature and Google docstring that forwards to MCP tool ``tool``."""
    schema = tool.get("inputSchema") or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    taken: set[str] = set()
    params, docs, names = [], [], {}
    for prop in sorted(props, key=lambda p: p not in required):  # required first (signature order)
        pname = _identifier(prop, taken)
        names[pname] = prop
        hint = _hint(props[prop])
        default = inspect.Parameter.empty if prop in required else None
        if default is None and not (hint is type(None) or "None" in repr(hint)):
            hint = hint | None
        params.append(
            inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=hint)
        )
        docs.append(f"    {pname}: {argument_doc(props[prop] if isinstance(props[prop], dict) else {}, prop)}")
    description = (tool.get("description") or tool["name"]).split("\n\n### Responses")[0].strip()
    doc = description + ("\n\nArgs:\n" + "\n".join(docs) if docs else "") + "\n\nReturns:\n    The tool's output."
    mcp_name = tool["name"]

    def method(self, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        arguments = {
            names.get(k, k): v
            for k, v in bound.arguments.items()
            if k != "self" and not (v is None and names.get(k, k) not in required)
        }
        return self._call(mcp_name, arguments)

    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    signature = inspect.Signature([self_param, *params], return_annotation=str)
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = {p.name: p.annotation for p in params} | {"return": str}
    method.__name__ = method.__qualname__ = method_name
    method.__doc__ = doc
    return method


class AWMEnvironment:
    """Base of the generated per-scenario environment classes (see the module docstring)."""

    _scenario: Scenario
    _tools: list[dict[str, Any]]
    _pool: ServerPool
    _default_task_idx: int | None = None
    _format_error_penalty: bool = True
    _stop_on_format_error: bool = False
    _verify_turn: str = "env_output"

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
        _close_episode(self.__dict__)
        self._episode = self._pool.new_episode(
            scenario, self._task_idx, format_error_ends_episode=self._stop_on_format_error
        )
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
        reward = ep.reward if self._format_error_penalty else ep.verifier_reward
        return float(reward if reward is not None else self._pool.rewards.other)

    def _episode_record(self) -> dict[str, Any] | None:
        return self._episode.record(self._verify_turn) if self._episode is not None else None

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
    *,
    task_idx: int | None = None,
    format_error_penalty: bool = True,
    stop_on_format_error: bool = False,
    verify_turn: str = "env_output",
) -> type[AWMEnvironment]:
    """The TRL environment class of ``scenario`` on ``pool`` (one method per MCP tool, + ``verify``)."""
    if verify_turn not in VERIFY_TURNS:
        raise ValueError(f"verify_turn must be one of {VERIFY_TURNS}, got {verify_turn!r}")
    pool.add(scenario)
    tools = pool.tools(scenario.name)
    taken: set[str] = set()
    methods: dict[str, Callable[..., str]] = {"verify": verify} if verify_turn == "env_output" else {}
    for tool in tools:
        name = _identifier(tool["name"], taken)
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
            "_format_error_penalty": format_error_penalty,
            "_stop_on_format_error": stop_on_format_error,
            "_verify_turn": verify_turn,
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


def resolve_pool(pool: ServerPool | None, max_servers: int, **kwargs: Any) -> ServerPool:
    """``pool``, or a new one of ``max_servers`` (``kwargs``: its settings) that :func:`close_environments` stops."""
    if pool is not None:
        return pool
    pool = ServerPool(max_servers, **kwargs)
    _factory_pools.append(pool)
    return pool


def awm_environment_factory(
    source: ScenarioSource | Scenario,
    scenario: str | None = None,
    *,
    task_idx: int | None = None,
    format_error_penalty: bool = True,
    rewards: RewardConfig | None = None,
    tool_timeout: float = 30.0,
    verifier_timeout: float = 30.0,
    verify_turn: str = "env_output",
    stop_on_format_error: bool = False,
    pool: ServerPool | None = None,
    max_servers: int = 4,
    unsafe_no_sandbox: bool = False,
) -> Callable[[], AWMEnvironment]:
    """A zero-argument factory for ``GRPOTrainer(environment_factory=...)`` (one scenario).

    Starts the scenario's first server now (its tools become the class's methods); instances
    share ``pool`` (a new one of ``max_servers`` when not given). ``close_environments()`` (or
    interpreter exit) stops everything. Generated code runs in the bwrap sandbox;
    ``unsafe_no_sandbox=True`` runs it uncontained (refused otherwise where no sandbox can be had).
    """
    sc = source if isinstance(source, Scenario) else source.load(scenario or "")
    pool = resolve_pool(
        pool,
        max_servers,
        rewards=rewards,
        tool_timeout=tool_timeout,
        verifier_timeout=verifier_timeout,
        unsafe_no_sandbox=unsafe_no_sandbox,
    )
    return make_factory(
        environment_class(
            pool,
            sc,
            task_idx=task_idx,
            format_error_penalty=format_error_penalty,
            stop_on_format_error=stop_on_format_error,
            verify_turn=verify_turn,
        )
    )


def awm_environment_factories(
    scenarios: Sequence[Scenario],
    *,
    format_error_penalty: bool = True,
    rewards: RewardConfig | None = None,
    tool_timeout: float = 30.0,
    verifier_timeout: float = 30.0,
    verify_turn: str = "env_output",
    stop_on_format_error: bool = False,
    pool: ServerPool | None = None,
    max_servers: int = 4,
    unsafe_no_sandbox: bool = False,
) -> dict[str, Callable[[], AWMEnvironment]]:
    """``{scenario name: factory}`` for TRL's multi-environment mode, all on one server pool.

    Rows choose their environment by their ``environment`` column, which
    :func:`awm_task_dataset` sets to the row's ``scenario``. Each scenario's first server starts
    here (for its tool list) and is closed again when the pool needs room.
    """
    names = [sc.name for sc in scenarios]
    if len(set(names)) != len(names):
        raise ValueError(f"scenario names repeat: {names}")
    pool = resolve_pool(
        pool,
        max_servers,
        rewards=rewards,
        tool_timeout=tool_timeout,
        verifier_timeout=verifier_timeout,
        unsafe_no_sandbox=unsafe_no_sandbox,
    )
    return {
        sc.name: make_factory(
            environment_class(
                pool,
                sc,
                format_error_penalty=format_error_penalty,
                stop_on_format_error=stop_on_format_error,
                verify_turn=verify_turn,
            )
        )
        for sc in scenarios
    }


def close_environments() -> None:
    """Stop every environment instance and server pool created by a factory in this process."""
    for env in list(_instances):
        env._close()
    while _factory_pools:
        _factory_pools.pop().close()


def awm_task_dataset(
    scenario: Scenario | Sequence[Scenario],
    task_indices: list[int] | dict[str, list[int] | None] | None = None,
    *,
    repeats: int = 1,
    system_prompt: str | None = None,
):
    """A ``datasets.Dataset`` of prompts for online training: one row per task (x ``repeats``).

    Columns: ``prompt`` (system + user task, TRL conversational format), ``task_idx``,
    ``scenario``; with several scenarios also ``environment`` (= ``scenario``, the column TRL's
    multi-environment mode routes by), rows interleaved across scenarios so every batch mixes
    them. ``task_indices``: a list (one scenario) or ``{scenario: list or None}``; None = every
    task. ``system_prompt``: ``{scenario}`` is filled in, other braces are text.
    """
    from datasets import Dataset

    many = not isinstance(scenario, Scenario)
    scenarios = list(scenario) if many else [scenario]
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
