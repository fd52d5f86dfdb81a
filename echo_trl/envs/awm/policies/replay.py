"""Replay scripted or recorded tool-call sequences (``echo-trl capture --policy replay:FILE``).

Replay file format (``--policy replay:FILE``)
---------------------------------------------
``.jsonl`` (one scripted episode per line) or ``.json`` (a list of them, or ``{"episodes": [...]}``)::

    {"task_idx": 0,                                   # required: which task this script plays
     "scenario": "content_platform_1",                # optional: must match the captured scenario
     "label": "reference",                            # optional: kept in the episode metadata
     "calls": [{"tool_name": "search_channels", "arguments": {"query": "Kurzgesagt"}},
               {"tool_name": "subscribe_to_channel", "arguments": {"channel_id": 1}}],
     "final_answer": "Subscribed.",                   # optional: passed to the verifier
     "verify": true}                                  # optional (default true): end with the verifier

``steps`` is accepted for ``calls`` (``data/awm_scenarios/solutions.jsonl`` uses it), ``tool`` /
``name`` for ``tool_name`` and ``args`` for ``arguments``. A task may
have several scripts (e.g. a reference solution and realistic failures); episode *i* of a task
plays its script ``i mod n``, so ``--episodes N`` gives groups whose rewards differ. A script
stops early when the environment ends the episode (server failure; a format error too with
``format_error_ends_episode``).

Recorded episodes are replay input too: the OpenEnv capture shape (what ``echo-trl capture``
writes) and AWM's ``trajectory.json``, as ``.json`` / ``.jsonl`` files or directories of them,
read with :func:`echo_trl.data.readers.episode_files.iter_episode_records` and validated by
:func:`echo_trl.data.readers.records.awm_episode_to_trajectory` (errors name file, record and field). Their tool
calls are replayed (a final ``verify`` step, or a ``verification`` entry, becomes the verifier
run with the recorded final answer), and every step is compared with the recording
(:mod:`~echo_trl.envs.awm.policies.replay_check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....data.readers.episode_files import iter_episode_records
from ....data.readers.records import awm_episode_to_trajectory
from ....errors import EpisodeError
from ..runtime.episode import Episode
from .policy import PolicyError
from .replay_check import check_replay


@dataclass
class Script:
    task_idx: int
    calls: list[tuple[str, Any]]
    final_answer: str | None = None
    verify: bool = True
    label: str = ""
    scenario: str | None = None
    source: str = ""
    expected: list[str] | None = None  # recorded observation text per call (+ the verifier's): replay check
    outcomes: list[tuple[Any, Any]] | None = None  # recorded (reward_type, reward) per step, None where absent


class ReplayPolicy:
    """Plays scripted or recorded tool-call sequences (see the module docstring for the formats)."""

    def __init__(self, scripts: list[Script]):
        self.scripts = scripts

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayPolicy:
        """Scripts and recorded episodes from a file or a directory (``.json`` / ``.jsonl``)."""
        path = Path(path)
        if not path.exists():
            raise PolicyError(f"replay file not found: {path}")
        scripts: list[Script] = []
        for rec in iter_episode_records([path]):
            source = f"{rec.source}:{rec.record}" if rec.record else rec.source
            if rec.error is not None:
                raise PolicyError(str(rec.error))
            items = rec.data.get("episodes") if isinstance(rec.data, dict) and "episodes" in rec.data else [rec.data]
            if not isinstance(items, list):
                raise PolicyError(f"{source}: episodes: expected a list of scripts")
            for i, item in enumerate(items):
                where = source if len(items) == 1 and items[0] is rec.data else f"{source}:episodes[{i}]"
                scripts.append(
                    _recorded(where, rec.source, rec.record, item)
                    if is_recorded_episode(item)
                    else _script(where, item)
                )
        if not scripts:
            raise PolicyError(f"no replay scripts or recorded episodes in {path}")
        return cls(scripts)

    @property
    def recorded(self) -> bool:
        """Whether every script is a recorded episode (then each is replayed once by default)."""
        return all(s.expected is not None for s in self.scripts)

    def count(self, scenario: str, task_idx: int) -> int:
        return sum(1 for s in self.scripts if s.task_idx == task_idx and s.scenario in (None, scenario))

    def tasks(self, scenario: str) -> list[int]:
        return sorted({s.task_idx for s in self.scripts if s.scenario in (None, scenario)})

    def script_for(self, scenario: str, task_idx: int, episode_index: int) -> Script:
        mine = [s for s in self.scripts if s.task_idx == task_idx and s.scenario in (None, scenario)]
        if not mine:
            raise PolicyError(f"the replay file has no script for scenario {scenario!r} task {task_idx}")
        return mine[episode_index % len(mine)]

    def play(self, episode: Episode, episode_index: int = 0) -> None:
        script = self.script_for(
            episode.scenario, episode.task_idx if episode.task_idx is not None else -1, episode_index
        )
        episode.notes.append(f"replay {script.source}" + (f" ({script.label})" if script.label else ""))
        observed: list[dict[str, Any]] = []
        for name, args in script.calls:
            observed.append(episode.call_tool(name, args))
            if observed[-1].get("done"):
                break
        if not episode.done:
            if script.verify:
                observed.append(episode.verify(script.final_answer))
            else:
                episode.end_without_verifying("stopped")
        if script.expected is not None:
            check_replay(episode, script.expected, script.outcomes or [], observed)


def is_recorded_episode(data: Any) -> bool:
    """A recorded episode (OpenEnv capture shape or AWM ``trajectory.json``), not a replay script."""
    if not isinstance(data, dict):
        return False
    steps = data.get("steps")
    return "trajectory" in data or (
        isinstance(steps, list) and any(isinstance(s, dict) and isinstance(s.get("action"), dict) for s in steps)
    )


def _is_verifier_call(name: str, arguments: Any) -> bool:
    return name == "verify" and isinstance(arguments, dict) and set(arguments) <= {"verifier_mode", "final_answer"}


def _recorded(where: str, source: str, record: str, data: dict[str, Any]) -> Script:
    """A recorded episode as a script whose ``expected`` holds the recorded observations."""
    verification = data.get("verification")
    body = (
        {**data, "steps": [*data["steps"], verification]}
        if isinstance(verification, dict) and isinstance(data.get("steps"), list)
        else data
    )
    if body.get("reward") is None:  # replay needs no reward; a recording without one is still replayable
        body = {**body, "reward": 0.0}
    try:
        traj = awm_episode_to_trajectory(body, source=source, record=record or None, system_prompt=None)
    except EpisodeError as exc:
        raise PolicyError(f"recorded episode: {exc}") from None
    outcomes = [_recorded_outcome(s) for s in _recorded_steps(body)]
    calls: list[tuple[str, Any]] = []
    expected: list[str] = []
    for message in traj.completion:
        if message["role"] == "tool":
            expected.append(message["content"])
            continue
        fn = message["tool_calls"][0]["function"]
        args = fn["arguments"]
        calls.append((fn["name"], args["_raw"] if set(args) == {"_raw"} else args))
    verify, final_answer = False, None
    if calls and _is_verifier_call(*calls[-1]):
        verify, final_answer = True, calls.pop()[1].get("final_answer")
    return Script(traj.task_idx, calls, final_answer, verify, "recorded", traj.scenario, where, expected, outcomes)


def _recorded_steps(body: dict[str, Any]) -> list[Any]:
    """The recorded steps in replay order (OpenEnv capture shape, or trajectory.json less list_tools)."""
    if "trajectory" in body and isinstance(body["trajectory"], list):
        return [e for e in body["trajectory"] if not (isinstance(e, dict) and e.get("action") == "list_tools")]
    return list(body.get("steps") or [])


def _recorded_outcome(step: Any) -> tuple[Any, Any]:
    """(reward_type, reward) a recorded step carries, None for what it lacks."""
    if not isinstance(step, dict):
        return None, None
    obs = step.get("observation") if isinstance(step.get("observation"), dict) else step
    reward = step.get("reward")
    return obs.get("reward_type"), reward if isinstance(reward, (int, float)) and not isinstance(
        reward, bool
    ) else None


def _script(source: str, d: Any) -> Script:
    if not isinstance(d, dict):
        raise PolicyError(f"{source}: expected an object, got {type(d).__name__}")
    idx = d.get("task_idx")
    if not isinstance(idx, int) or isinstance(idx, bool):
        raise PolicyError(f"{source}: task_idx: expected an integer, got {idx!r}")
    key = "calls" if "calls" in d else "steps" if "steps" in d else None
    if key is None:
        raise PolicyError(f"{source}: calls: missing (a list of tool calls; 'steps' is accepted too)")
    calls = d[key]
    if not isinstance(calls, list):
        raise PolicyError(f"{source}: {key}: expected a list")
    out = []
    for i, c in enumerate(calls):
        if not isinstance(c, dict):
            raise PolicyError(f"{source}: {key}[{i}]: expected an object")
        name = c.get("tool_name", c.get("tool", c.get("name")))
        if not isinstance(name, str) or not name:
            raise PolicyError(f"{source}: {key}[{i}].tool_name: expected a non-empty string")
        out.append((name, c.get("arguments", c.get("args", {}))))
    fa = d.get("final_answer")
    if fa is not None and not isinstance(fa, str):
        raise PolicyError(f"{source}: final_answer: expected a string")
    scenario = d.get("scenario")
    if scenario is not None and not isinstance(scenario, str):
        raise PolicyError(f"{source}: scenario: expected a string")
    return Script(idx, out, fa, bool(d.get("verify", True)), str(d.get("label", "")), scenario, source)
