"""Collect AWM episodes at scale: many scenarios and tasks, episodes in flight at once.

The work is a list of :class:`Job` (scenario, task, episode index): ``--episodes`` per task makes a
GRPO group. :func:`run_jobs` keeps ``concurrency`` of them in flight on threads (a policy waits on
its inference server, the environments on their scenario servers), all sharing one bounded
:class:`~echo_trl.envs.awm.runtime.pool.ServerPool`; :func:`pooled_runner` plays one job on it.
A killed run (``kill -9``) loses only the episodes in flight: the records are stored as they finish
(:mod:`~echo_trl.envs.awm.capture.store`), and a rerun plays only the jobs not stored yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from ..runtime.pool import ServerPool
from .store import CollectError


@dataclass(frozen=True)
class Job:
    """One episode to play: task ``task_idx`` of ``scenario``, the ``index``-th episode of its group."""

    scenario: str
    task_idx: int
    index: int

    @property
    def key(self) -> str:
        return f"{self.scenario}/{self.task_idx}/{self.index}"


def plan_jobs(tasks: dict[str, list[int]], episodes: Callable[[str, int], int]) -> list[Job]:
    """Every (scenario, task, episode) to play, groups together, scenarios and tasks in the given order."""
    return [Job(s, k, i) for s, ks in tasks.items() for k in ks for i in range(episodes(s, k))]


def pooled_runner(
    pool: ServerPool,
    policy: Any,
    *,
    verify_turn: str,
    format: str,
    stop_on_format_error: bool = False,
    sampler: dict[str, Any] | None = None,
) -> Callable[[Job], dict[str, Any]]:
    """A function that plays one job on ``pool`` with ``policy`` and returns its record.

    A policy whose ``play`` returns a list (:class:`~echo_trl.envs.awm.policies.openai.OpenAIPolicy`) gets it
    recorded as ``sampler.turns``, beside ``sampler`` (where it sampled: server, model, settings).
    """

    def run(job: Job) -> dict[str, Any]:
        episode = pool.new_episode(job.scenario, job.task_idx, format_error_ends_episode=stop_on_format_error)
        try:
            turns = policy.play(episode, job.index)
            if not episode.done:
                episode.verify()
        finally:
            episode.close()
        record = episode.record(verify_turn)
        record["metadata"]["format"] = format
        record["metadata"]["episode"] = {"key": job.key, "index": job.index}
        if isinstance(turns, list):
            record["sampler"] = {**(sampler or {}), "turns": turns}
        return record

    return run


def run_jobs(
    jobs: list[Job],
    run: Callable[[Job], dict[str, Any]],
    *,
    concurrency: int = 1,
    on_stop: Callable[[], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Play ``jobs`` with at most ``concurrency`` in flight; yield each record as it finishes.

    The first job that raises stops new ones from starting; those in flight finish (their records
    are yielded) and the error is raised after them, so nothing already played is lost. When the
    consumer stops instead (Ctrl-C or SIGTERM inside the generator, or the generator closed), no job
    starts and ``on_stop`` ends those in flight, whose records are dropped (a rerun plays them).
    """
    if concurrency < 1:
        raise CollectError(f"--concurrency must be >= 1, got {concurrency}")
    todo = iter(jobs)
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="echo-collect") as ex:
        running: set[Future] = set()

        def refill() -> None:
            while failure is None and len(running) < concurrency:
                job = next(todo, None)
                if job is None:
                    return
                running.add(ex.submit(run, job))

        refill()
        try:
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    running.discard(fut)
                    try:
                        record = fut.result()
                    except BaseException as exc:  # noqa: BLE001 - re-raised once the others finished
                        failure = failure or exc
                        continue
                    yield record
                refill()
        except BaseException:  # the consumer stopped (Ctrl-C, SIGTERM): start nothing more
            failure = failure or RuntimeError("stopped")
            for fut in running:
                fut.cancel()
            if on_stop is not None:  # end the jobs in flight: leaving the executor waits for them
                on_stop()
            raise
    if failure is not None:
        raise failure
