"""A batch's environment work in flight together: the G rollouts' tool calls, and their verification.

TRL 1.16's tool loop calls each rollout's tools one rollout after another, and its ``get_reward`` wrapper scores
one environment after another (its async paths too: it awaits rollout by rollout), so a batch's environment time
grows linearly in its rollouts. An environment class that sets ``concurrent_rollouts = True`` declares that its
instances share no mutable state (each rollout has its own server session and database) and that ``get_reward``
may be called again after it returned (the second call returns the first's value); for such environments:

* :class:`ToolPrefetch` stands in for the per-rollout tool dicts TRL's loop reads. At the first tool call of an
  iteration it submits *every* rollout's pending calls (the tool calls of its last assistant message) to a thread
  pool, one job per rollout running its calls in their order; TRL's loop then reads each call's result (or its
  exception) in its own order. Same calls, same order within a rollout, same results: only the waiting overlaps;
* :func:`verify_all` runs the environments' ``get_reward`` in the pool before TRL's serial calls read them.

Pure Python (threads); TRL's attributes are swapped in and out by :mod:`echo_trl.train.trl_compat`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: The class attribute by which an environment declares its rollouts independent (see the module docstring).
CONCURRENT_ROLLOUTS = "concurrent_rollouts"

#: Threads of the pool (at most; one per rollout of a batch below it).
MAX_THREADS = 64


def concurrent(environments: Sequence[Any] | None) -> bool:
    """Whether every environment of the batch declares :data:`CONCURRENT_ROLLOUTS` (and there is more than one)."""
    return (
        bool(environments)
        and len(environments) > 1
        and all(getattr(type(e), CONCURRENT_ROLLOUTS, False) is True for e in environments)
    )


class RolloutThreads:
    """A thread pool sized to the largest batch seen (created on first use, kept across batches)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0

    def executor(self, rollouts: int) -> ThreadPoolExecutor:
        size = max(1, min(rollouts, MAX_THREADS))
        if self._pool is None or size > self._size:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool, self._size = ThreadPoolExecutor(size, thread_name_prefix="echo-rollout"), size
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _pending_calls(message: Any, tools: dict[str, Callable[..., Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The calls TRL 1.16's loop makes of ``tools`` for an assistant ``message``, in its order (it skips calls of
    other types and names it does not have as sync tools: those fail or run there, as before)."""
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return []
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        if call.get("type") == "function" and function.get("name") in tools:
            calls.append((function["name"], function.get("arguments") or {}))
    return calls


class ToolPrefetch:
    """Per-rollout tool dicts whose calls were dispatched for the whole batch at once (see the module docstring).

    ``completions`` is TRL's list of per-rollout message lists (read, never changed); ``tool_dicts`` TRL's
    per-rollout ``{name: bound method}``.
    """

    def __init__(self, completions: list[list[Any]], tool_dicts: Sequence[dict[str, Callable[..., Any]]], executor):
        self._completions, self._tools, self._executor = completions, list(tool_dicts), executor
        self._lock = threading.Lock()
        self._dispatched: set[tuple[int, int]] = set()  # (rollout, its message count) whose calls went out
        self._queues: list[deque[tuple[str, dict[str, Any], Future]]] = [deque() for _ in self._tools]
        self.dicts = [{name: self._caller(i, name) for name in tools} for i, tools in enumerate(self._tools)]

    def _caller(self, rollout: int, name: str) -> Callable[..., Any]:
        def call(**arguments: Any) -> Any:
            with self._lock:
                self._dispatch()
                queue = self._queues[rollout]
                expected = queue.popleft() if queue else None
            if expected is None or expected[:2] != (name, arguments):
                raise RuntimeError(
                    f"rollout {rollout}: TRL called {name}({arguments}) but the prefetched call was "
                    f"{None if expected is None else expected[:2]} (TRL's tool loop changed?)"
                )
            return expected[2].result()

        call.__name__ = name
        return call

    def _dispatch(self) -> None:
        """Submit every rollout's undispatched pending calls, one job per rollout (its calls run in order)."""
        for i, messages in enumerate(self._completions):
            key = (i, len(messages))
            if not messages or key in self._dispatched:
                continue
            calls = _pending_calls(messages[-1], self._tools[i])
            self._dispatched.add(key)
            if not calls:
                continue
            futures: list[Future] = [Future() for _ in calls]
            self._queues[i].extend((name, args, f) for (name, args), f in zip(calls, futures, strict=True))
            self._executor.submit(_run_in_order, [self._tools[i][name] for name, _ in calls], calls, futures)


def _run_in_order(functions: list[Callable[..., Any]], calls, futures: list[Future]) -> None:
    for function, (_, arguments), future in zip(functions, calls, futures, strict=True):
        try:
            future.set_result(function(**arguments))
        except BaseException as exc:  # TRL's loop turns the exception into the tool's error message
            future.set_exception(exc)


def verify_all(environments: Sequence[Any], executor) -> None:
    """Call every environment's ``get_reward`` in the pool (their results stay with the environments, which
    return them again to TRL's serial calls); errors are left for TRL's own call to raise."""
    scorers = [e.get_reward for e in environments if callable(getattr(e, "get_reward", None))]
    for future in [executor.submit(f) for f in scorers]:
        future.exception()  # wait; TRL's own call raises it again
