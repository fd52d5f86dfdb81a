"""AWM scenarios as a TRL ``environment_factory`` (online GRPO / ECHO against live environments).

TRL's contract (``trl.GRPOTrainer``, 1.16): the factory returns an instance; every public
*function defined on the instance's class* except ``reset`` and ``get_reward`` is a tool, named
by ``__name__`` and described to the model by ``transformers.utils.get_json_schema`` (type hints +
Google docstring). ``reset(**row)`` gets the dataset row and may return text appended to the
last user message; ``get_reward()`` scores the finished rollout. TRL makes one instance per
concurrent rollout and reuses (resets) them across batches.

So :func:`awm_environment_factory` starts one server to list the scenario's MCP tools, builds a
class whose methods are generated from each tool's ``inputSchema`` (a call forwards to the MCP
tool), and gives every instance its own :class:`~echo_trl.envs.awm.episode.AWMRuntime` (own
database + server; ``reset`` restores the snapshot in milliseconds). The reward is the task
verifier's (complete 1.0, ...), or the format-error reward when the rollout made a format
error (invalid arguments; unknown tool names are caught by TRL before reaching us).

What the ECHO trainer gets from an instance (all private, so TRL does not expose them as tools):
``_episode`` (the live :class:`Episode`: ``steps`` with each observation exactly as the model
saw it, ``reward_type``), ``_episode_record()`` (the OpenEnv capture shape, for logging or
``build-dataset``), ``_runtime``. The tool result strings returned to TRL are byte-identical to
the ``tool_result`` / ``error`` observations, so TRL's ``tool_mask`` marks exactly the env-output
text the ECHO world-model loss trains on.
"""

from __future__ import annotations

import inspect
import keyword
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .episode import AWMRuntime, Episode
from .scenario import Scenario, ScenarioSource
from .verifier import RewardConfig

_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                               "object": dict}


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
    if not ident or ident[0].isdigit() or keyword.iskeyword(ident) or ident.startswith("_") or ident in (
            "reset", "get_reward", "self"):
        ident = f"tool_{ident.lstrip('_')}"
    while ident in taken:
        ident += "_"
    taken.add(ident)
    return ident


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no description)"


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
        params.append(inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                        annotation=hint))
        docs.append(f"    {pname}: {_one_line(props[prop].get('description') or props[prop].get('title') or prop)}")
    description = (tool.get("description") or tool["name"]).split("\n\n### Responses")[0].strip()
    doc = description + ("\n\nArgs:\n" + "\n".join(docs) if docs else "") + "\n\nReturns:\n    The tool's output."
    mcp_name = tool["name"]

    def method(self, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        arguments = {names.get(k, k): v for k, v in bound.arguments.items()
                     if k != "self" and not (v is None and names.get(k, k) not in required)}
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
    _runtime_kwargs: dict[str, Any]
    _default_task_idx: int | None = None
    _format_error_penalty: bool = True

    def __init__(self, runtime: AWMRuntime | None = None):
        self._runtime = runtime or AWMRuntime(self._scenario, format_error_ends_episode=False,
                                              **self._runtime_kwargs).start()
        self._episode: Episode | None = None
        self._task_idx: int | None = None
        weakref.finalize(self, self._runtime.close)

    def reset(self, **kwargs: Any) -> str | None:
        """Start a rollout: restore the database, open a fresh MCP session.

        The task comes from the dataset row's ``task_idx`` (or the factory's default task).
        Returns the task text when the row's prompt does not already carry it.
        """
        task_idx = kwargs.get("task_idx", self._default_task_idx)
        if task_idx is None:
            raise ValueError("AWM environment: the dataset row needs a 'task_idx' column (or pass task_idx= to "
                             "awm_environment_factory)")
        self._task_idx = int(task_idx)
        self._episode = self._runtime.new_episode(self._task_idx)
        prompt = kwargs.get("prompt")
        last = prompt[-1].get("content") if isinstance(prompt, list) and prompt else prompt
        return None if isinstance(last, str) and last.strip() else self._episode.task

    def _call(self, tool_name: str, arguments: dict[str, Any]) -> str:
        if self._episode is None:
            raise RuntimeError("AWM environment: reset() was not called")
        obs = self._episode.call_tool(tool_name, arguments)
        return obs["tool_result"] if "tool_result" in obs else obs.get("error", "")

    def get_reward(self) -> float:
        """Verify the final database; the format-error reward instead if the rollout made one."""
        ep = self._episode
        if ep is None:
            return self._runtime.rewards.other
        if not ep.done:
            ep.verify()
        if self._format_error_penalty and any(
                s["observation"].get("reward_type") in ("tool_not_found", "invalid_args") for s in ep.steps):
            return self._runtime.rewards.format_error
        return float(ep.reward if ep.reward is not None else self._runtime.rewards.other)

    def _episode_record(self) -> dict[str, Any] | None:
        return self._episode.record() if self._episode is not None else None

    def _close(self) -> None:
        self._runtime.close()


_instances: weakref.WeakSet[AWMEnvironment] = weakref.WeakSet()
_lock = threading.Lock()


def awm_environment_factory(source: ScenarioSource | Scenario, scenario: str | None = None, *,
                            task_idx: int | None = None, format_error_penalty: bool = True,
                            rewards: RewardConfig | None = None, tool_timeout: float = 30.0,
                            verifier_timeout: float = 30.0, unsafe_no_sandbox: bool = False
                            ) -> Callable[[], AWMEnvironment]:
    """A zero-argument factory for ``GRPOTrainer(environment_factory=...)``.

    Starts one runtime now (to list the tools and build the class); the first instance reuses
    it, later instances start their own. ``close_environments()`` (or interpreter exit) stops all.
    Generated code runs in the bwrap sandbox; ``unsafe_no_sandbox=True`` runs it uncontained.
    """
    sc = source if isinstance(source, Scenario) else source.load(scenario or "")
    kwargs = {"rewards": rewards, "tool_timeout": tool_timeout, "verifier_timeout": verifier_timeout,
              "unsafe_no_sandbox": unsafe_no_sandbox}
    first = AWMRuntime(sc, format_error_ends_episode=False, **kwargs).start()
    taken: set[str] = set()
    methods = {}
    for tool in first.tools:
        name = _identifier(tool["name"], taken)
        methods[name] = make_tool_method(tool, name)
    cls_name = "AWMEnv_" + re.sub(r"\W", "_", sc.name)
    cls = type(cls_name, (AWMEnvironment,), {
        **methods, "_scenario": sc, "_tools": first.tools, "_runtime_kwargs": kwargs,
        "_default_task_idx": task_idx, "_format_error_penalty": format_error_penalty,
        "__doc__": f"AWM scenario {sc.name!r} as a TRL environment ({len(methods)} MCP tools)."})
    spare = [first]

    def factory() -> AWMEnvironment:
        with _lock:
            runtime = spare.pop() if spare else None
        env = cls(runtime)
        _instances.add(env)
        return env

    factory.environment_class = cls  # type: ignore[attr-defined]
    return factory


def close_environments() -> None:
    """Stop every environment instance created by a factory in this process."""
    for env in list(_instances):
        env._close()


def awm_task_dataset(scenario: Scenario, task_indices: list[int] | None = None, *, repeats: int = 1,
                     system_prompt: str | None = None):
    """A ``datasets.Dataset`` of prompts for online training: one row per task (x ``repeats``).

    Columns: ``prompt`` (system + user task, TRL conversational format), ``task_idx``,
    ``scenario``. ``reset`` reads ``task_idx`` from the row.
    """
    from datasets import Dataset

    from ...awm import DEFAULT_SYSTEM_PROMPT

    system = (system_prompt if system_prompt is not None else DEFAULT_SYSTEM_PROMPT).format(scenario=scenario.name)
    rows = {"prompt": [], "task_idx": [], "scenario": []}
    for k in task_indices if task_indices is not None else range(len(scenario.tasks)):
        for _ in range(repeats):
            prompt = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": scenario.task(k)}]
            rows["prompt"].append(prompt)
            rows["task_idx"].append(k)
            rows["scenario"].append(scenario.name)
    return Dataset.from_dict(rows)
