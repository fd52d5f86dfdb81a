"""Collect AWM episodes at scale: many scenarios and tasks, episodes in flight at once, resumable output.

The work is a list of :class:`Job` (scenario, task, episode index): ``--episodes`` per task makes a
GRPO group. :func:`run_jobs` keeps ``concurrency`` of them in flight on threads (a policy waits on
its inference server, the environments on their scenario servers), all sharing one bounded
:class:`~echo_trl.envs.awm.pool.ServerPool`; :func:`pooled_runner` plays one job on it.

The output (:class:`EpisodeStore`) is written as episodes finish: each record is appended to its
task's ``<scenario>_task<K>.jsonl`` as one write of one whole line, then flushed to disk. A killed
run (``kill -9``) loses only the episodes in flight; should it die inside a write, the rerun cuts
the unterminated last line before anything else, so no half record is ever read. Every record
names its job (``metadata.episode.key``): a rerun with the same output skips the jobs already
there, so no episode is ever written twice. ``capture_state.json`` keeps the
settings that shape episodes (a rerun with others is refused: the groups would mix two policies),
and a lock file keeps a second writer out. :func:`summarize` reads the records back for the summary
(episodes, reward mean per scenario, outcomes, format and tool errors, tokens, log-prob alignment).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...data.episode_files import iter_episode_records
from ...data.records import sampled_turns
from ...errors import EchoTrlError
from .episode import FORMAT_ERRORS
from .pool import ServerPool

try:
    import fcntl
except ImportError:  # no flock (Windows): a second writer is not detected
    fcntl = None

EPISODE_GLOB = "*_task*.jsonl"
STATE_FILE = "capture_state.json"
SUMMARY_FILE = "capture_summary.json"
LOCK_FILE = ".capture.lock"
#: Step outcomes counted as tool errors (the environment refused or failed a well-formed call).
TOOL_ERRORS = ("tool_error", "server_error", "timeout")


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


def record_key(record: Any) -> str | None:
    """The job key a collected record carries (``None`` for a record written by something else)."""
    if not isinstance(record, dict):
        return None
    episode = (record.get("metadata") or {}).get("episode")
    return episode.get("key") if isinstance(episode, dict) and isinstance(episode.get("key"), str) else None


class CollectError(EchoTrlError):
    """The output cannot be collected into (other settings, another writer, unreadable lines)."""


class EpisodeStore:
    """The output directory: each finished episode appended to its task's file; what is already there."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self._lock = threading.Lock()
        self._lock_fd: int | None = None
        self.written = 0
        self.repaired: list[str] = []

    # -- ownership and settings ----------------------------------------------------------------

    def acquire(self) -> None:
        """Hold the output's writer lock (a one-line error while another capture writes there), then cut the
        torn last line a killed run may have left (:meth:`repair`)."""
        if fcntl is not None:
            fd = os.open(self.out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise CollectError(f"--output {self.out}: another capture holds {LOCK_FILE} there") from None
            self._lock_fd = fd
        self.repair()

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Record ``settings`` on the first run; on a rerun refuse any that differ (named, both values)."""
        path = self.out / STATE_FILE
        if path.exists():
            try:
                known = json.loads(path.read_text(encoding="utf-8"))["settings"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise CollectError(f"{path}: unreadable ({exc}); remove it or use another --output") from None
            changed = [k for k in sorted(set(known) | set(settings)) if known.get(k) != settings.get(k)]
            if changed:
                k = changed[0]
                raise CollectError(
                    f"--output {self.out} was collected with {k}={known.get(k)!r}, this run asks {settings.get(k)!r} "
                    f"({len(changed)} setting(s) differ: {', '.join(changed)}): continue with the same settings "
                    "or collect into another --output"
                )
            return
        _atomic_write(path, json.dumps({"settings": settings}, indent=2, sort_keys=True) + "\n")

    # -- reading -------------------------------------------------------------------------------

    def paths(self) -> list[Path]:
        return sorted(self.out.glob(EPISODE_GLOB))

    def repair(self) -> None:
        """Cut a last line without its newline: an episode a ``kill -9`` interrupted while it was being appended
        (the rerun plays it again). Complete lines are never touched."""
        for path in self.paths():
            with open(path, "rb+") as fh:
                size = fh.seek(0, os.SEEK_END)
                if size == 0:
                    continue
                fh.seek(size - 1)
                if fh.read(1) == b"\n":
                    continue
                tail = min(size, 1 << 20)
                while True:  # find the last newline, reading backwards in chunks
                    fh.seek(size - tail)
                    cut = fh.read(tail).rfind(b"\n")
                    if cut >= 0 or tail == size:
                        break
                    tail = min(size, tail * 2)
                keep = size - tail + cut + 1 if cut >= 0 else 0
                fh.truncate(keep)
                self.repaired.append(f"{path.name}: cut {size - keep} bytes of an episode left half-written")

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record of the output's episode files (a line that does not read is an error: lines are whole)."""
        paths = self.paths()
        if not paths:
            return
        for rec in iter_episode_records(paths):
            if rec.error is not None:
                raise CollectError(f"{rec.error} (move the file away to collect again)")
            yield rec.data

    def done_keys(self) -> set[str]:
        return {k for k in map(record_key, self.records()) if k is not None}

    # -- writing -------------------------------------------------------------------------------

    def add(self, record: dict[str, Any]) -> None:
        """Append a finished episode to ``<scenario>_task<K>.jsonl`` as one write of one whole line, then fsync."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        path = self.out / f"{record['scenario']}_task{record['task_idx']}.jsonl"
        with self._lock:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            self.written += 1


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a hidden temporary file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------------------------
# Playing


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

    A policy whose ``play`` returns a list (:class:`~echo_trl.envs.awm.openai_policy.OpenAIPolicy`) gets it
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
    jobs: list[Job], run: Callable[[Job], dict[str, Any]], *, concurrency: int = 1
) -> Iterator[dict[str, Any]]:
    """Play ``jobs`` with at most ``concurrency`` in flight; yield each record as it finishes.

    The first job that raises stops new ones from starting; those in flight finish (their records
    are yielded) and the error is raised after them, so nothing already played is lost.
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
            raise
    if failure is not None:
        raise failure


# --------------------------------------------------------------------------------------------
# Summary


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over collected records: what a person checks before training on them.

    Per scenario: episodes and reward mean. Outcomes (``reward_type``), format errors (unknown tool,
    invalid arguments) and tool errors (the environment refused or failed a call) over all steps,
    tokens the server reported (prompt and completion), and the sampler log-prob alignment: turns
    with token ids and log-probs, turns aligned with the trainer's tokenization, turns flagged, and
    episodes that carry ``behavior_logprobs``.
    """
    by_scenario: dict[str, list[float]] = defaultdict(list)
    outcomes: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    tokens = Counter()
    align = Counter()
    for rec in records:
        by_scenario[rec.get("scenario", "?")].append(float(rec.get("reward", 0.0)))
        outcomes[rec.get("reward_type", "?")] += 1
        for step in [*rec.get("steps", []), *([rec["verification"]] if "verification" in rec else [])]:
            steps[step.get("observation", {}).get("reward_type", "?")] += 1
        sampler = rec.get("sampler") or {}
        turns = sampled_turns(rec)
        for turn in turns:
            usage = turn.get("usage") or {}
            tokens["prompt"] += int(usage.get("prompt_tokens", 0))
            tokens["completion"] += int(usage.get("completion_tokens", 0))
        align["turns"] += len(turns)
        align["turns_with_logprobs"] += sum(1 for t in turns if t.get("logprobs") is not None and t.get("token_ids"))
        checked = sampler.get("alignment") or {}
        align["turns_aligned"] += int(checked.get("aligned_turns", 0))
        align["turns_flagged"] += len(checked.get("flagged") or [])
        align["episodes_with_behavior_logprobs"] += rec.get("behavior_logprobs") is not None
    n = sum(len(v) for v in by_scenario.values())
    return {
        "episodes": n,
        "scenarios": {
            s: {"episodes": len(v), "reward_mean": round(sum(v) / len(v), 4)} for s, v in sorted(by_scenario.items())
        },
        "reward_mean": round(sum(sum(v) for v in by_scenario.values()) / n, 4) if n else None,
        "outcomes": dict(sorted(outcomes.items())),
        "steps": sum(steps.values()),
        "format_errors": sum(steps[k] for k in FORMAT_ERRORS),
        "tool_errors": sum(steps[k] for k in TOOL_ERRORS),
        "tokens": {"prompt": tokens["prompt"], "completion": tokens["completion"]},
        "logprobs": dict(align),
    }


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as the lines ``capture`` prints and logs."""
    lp = summary["logprobs"]
    lines = [
        f"episodes: {summary['episodes']} (reward mean {summary['reward_mean']})",
        *(
            f"  {name}: {s['episodes']} episodes, reward mean {s['reward_mean']}"
            for name, s in summary["scenarios"].items()
        ),
        f"outcomes: {json.dumps(summary['outcomes'], sort_keys=True)}",
        f"steps: {summary['steps']}; format errors: {summary['format_errors']}; tool errors: {summary['tool_errors']}",
        f"tokens: prompt {summary['tokens']['prompt']}, completion {summary['tokens']['completion']}",
    ]
    if lp.get("turns"):
        lines.append(
            f"sampled turns: {lp['turns']}, with token ids and log-probs {lp.get('turns_with_logprobs', 0)}, "
            f"aligned with the trainer's tokenization {lp.get('turns_aligned', 0)}, "
            f"FLAGGED (token ids differ) {lp.get('turns_flagged', 0)}; "
            f"episodes with behavior_logprobs: {lp.get('episodes_with_behavior_logprobs', 0)}"
        )
    return lines


def write_summary(out: Path, summary: dict[str, Any]) -> Path:
    path = out / SUMMARY_FILE
    _atomic_write(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path
