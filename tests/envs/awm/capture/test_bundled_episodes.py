"""The bundled episodes (``data/episodes``) carry what the upstream server and the local runtime give.

Two independent expectations for the same calls: the upstream OpenEnv ``agent_world_model_env``
server's answers (``tests/fixtures/upstream_awm/recordings.jsonl``, recorded from that server), and
the local runtime replaying the episodes now (``echo-trl capture --policy replay:data/episodes``).
Per step: the same observation, ``reward_type`` and reward; per episode: the same reward.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from echo_trl.commands.cli import main as cli
from echo_trl.envs.awm.policies.replay_check import normalize_timestamps

REPO = Path(__file__).resolve().parents[4]
EPISODES = REPO / "data" / "episodes"
LIBRARY = REPO / "data" / "awm_scenarios"
RECORDINGS = REPO / "tests" / "fixtures" / "upstream_awm" / "recordings.jsonl"


def bundled() -> dict[str, dict[str, Any]]:
    """Every bundled episode under the name the upstream recordings give it (``data/episodes/FILE:LINE``)."""
    return {
        f"data/episodes/{f.name}:{n}": json.loads(line)
        for f in sorted(EPISODES.glob("*.jsonl"))
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), start=1)
    }


def outcomes(episode: dict[str, Any]) -> list[tuple[str, float]]:
    return [(s["observation"].get("reward_type"), s.get("reward")) for s in episode["steps"]]


def shown(obs: dict[str, Any]) -> str:
    """An observation less echo_trl's bookkeeping (``done``, ``metadata``), as comparable text."""
    kept = {k: v for k, v in obs.items() if k not in ("done", "metadata")}
    return normalize_timestamps(json.dumps(kept, sort_keys=True))


def test_the_bundled_episodes_agree_with_the_upstream_server_step_by_step():
    upstream = {r["name"]: r for r in map(json.loads, RECORDINGS.read_text(encoding="utf-8").splitlines())}
    episodes = bundled()
    assert len(episodes) == 60
    for name, ep in episodes.items():
        rec = upstream[name]
        calls = [s["action"] for s in ep["steps"] if s["action"]["tool_name"] != "verify"]
        assert [[c["tool_name"], c["arguments"]] for c in calls] == rec["calls"], name
        replies = [ex["reply"]["data"] for ex in rec["exchanges"][2:-1]]  # less reset, list_tools and done
        assert outcomes(ep) == [(r["observation"]["reward_type"], r["reward"]) for r in replies], name
        assert [shown(s["observation"]) for s in ep["steps"]] == [shown(r["observation"]) for r in replies], name
        # AWM's episode rule on the server's step rewards: -1.0 after any format error, else the
        # verifier's reward, or 0.0 for an episode stopped without verifying
        if any(r["reward"] == -1.0 for r in replies):
            want = ("format_error", -1.0)
        elif rec["end"] == "done":
            want = ("stopped", 0.0)
        else:
            want = (replies[-1]["observation"]["reward_type"], replies[-1]["reward"])
        assert (ep["reward_type"], ep["reward"]) == want, name


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> tuple[dict[str, dict[str, Any]], str]:
    """The bundled episodes replayed on the local runtime (each recording once, in file order)."""
    out = tmp_path_factory.mktemp("replayed")
    argv = ["capture", "--data", str(LIBRARY), "--scenario", "library_1", "--policy", f"replay:{EPISODES}"]
    assert cli([*argv, "--output", str(out)]) == 0
    live = {
        f"data/episodes/{f.name}:{n}": json.loads(line)
        for f in sorted(out.glob("*.jsonl"))
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), start=1)
    }
    return live, (out / "capture_log.txt").read_text(encoding="utf-8")


def test_the_bundled_episodes_replay_exactly_on_the_local_runtime(replayed):
    live, log = replayed
    episodes = bundled()
    assert live.keys() == episodes.keys()
    for name, ep in episodes.items():
        again = live[name]
        assert [s["action"] for s in again["steps"]] == [s["action"] for s in ep["steps"]], name
        assert outcomes(again) == outcomes(ep), name
        assert [shown(s["observation"]) for s in again["steps"]] == [shown(s["observation"]) for s in ep["steps"]]
        assert (again["reward_type"], again["reward"]) == (ep["reward_type"], ep["reward"]), name
        assert all(s["replay_match"] for s in again["steps"]), name
    total = sum(len(ep["steps"]) for ep in episodes.values())
    assert f"replay check total: {total}/{total} live observations equal the recorded ones" in log


def test_the_bundled_capture_log_is_the_one_that_wrote_the_episodes():
    """capture_log.txt's counts are those of the files beside it (a re-capture refreshes both)."""
    log = (EPISODES / "capture_log.txt").read_text(encoding="utf-8")
    episodes = list(bundled().values())
    kinds: dict[str, int] = {}
    for ep in episodes:
        kinds[ep["reward_type"]] = kinds.get(ep["reward_type"], 0) + 1
    assert f"outcomes: {json.dumps(dict(sorted(kinds.items())))}" in log
    assert f"steps: {sum(len(ep['steps']) for ep in episodes)};" in log
    mean = round(sum(ep["reward"] for ep in episodes) / len(episodes), 4)
    assert f"episodes: {len(episodes)} (reward mean {mean})" in log
