"""``echo-trl capture``: replay and model policies -> episodes that build-dataset reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_trl.awm import load_awm_episodes
from echo_trl.cli import main as cli
from echo_trl.envs.awm.policy import PolicyError, ReplayPolicy

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "awm1k_samples"

SCRIPTS = [
    {"task_idx": 0, "label": "reference", "calls": [
        {"tool_name": "search_channels", "arguments": {"query": "Kurzgesagt"}},
        {"tool_name": "subscribe_to_channel", "arguments": {"channel_id": 1}}], "final_answer": "Subscribed."},
    {"task_idx": 0, "label": "unknown tool", "calls": [{"tool": "subscribe", "args": {"channel": "Kurzgesagt"}}]},
    {"task_idx": 1, "label": "wrong args", "calls": [{"tool_name": "search_channels", "arguments": {"query": 3}}]},
    {"task_idx": 1, "label": "stops early", "calls": [{"tool_name": "search_channels",
                                                       "arguments": {"query": "Marques"}}], "verify": False},
]


def _samples() -> Path:
    if not SAMPLES.is_dir():
        pytest.skip(f"shared AWM-1K samples not found at {SAMPLES} (they live in ../shared/data, not in the repo)")
    return SAMPLES


def test_replay_file_parsing(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(s) for s in SCRIPTS) + "\n")
    pol = ReplayPolicy.from_file(f)
    assert pol.tasks("content_platform_1") == [0, 1]
    assert pol.script_for("content_platform_1", 0, 3).label == "unknown tool"  # 3 mod 2 == 1
    (tmp_path / "l.json").write_text(json.dumps({"episodes": SCRIPTS[:1]}))
    assert len(ReplayPolicy.from_file(tmp_path / "l.json").scripts) == 1
    (tmp_path / "bad.jsonl").write_text('{"task_idx": "0"}\n')
    with pytest.raises(PolicyError, match=r"bad.jsonl:1: task_idx: expected an integer"):
        ReplayPolicy.from_file(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text('{"task_idx": 0, "calls": [{"arguments": {}}]}\n')
    with pytest.raises(PolicyError, match=r"calls\[0\].tool_name"):
        ReplayPolicy.from_file(tmp_path / "bad2.jsonl")


def test_capture_cli_replay(tmp_path, capsys):
    data = _samples()
    replay = tmp_path / "replay.jsonl"
    replay.write_text("\n".join(json.dumps(s) for s in SCRIPTS) + "\n")
    out = tmp_path / "out"
    rc = cli(["capture", "--data", str(data), "--scenario", "content_platform_1", "--policy", f"replay:{replay}",
              "--episodes", "2", "--output", str(out)])
    assert rc == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["capture_log.txt", "content_platform_1_task0.jsonl", "content_platform_1_task1.jsonl"]
    trajs, skipped = load_awm_episodes([out])
    assert not skipped and len(trajs) == 4
    assert [t.reward for t in trajs] == [0.0, -1.0, -1.0, 0.0]  # no verifier in the sample -> 0.0
    assert {t.group_id for t in trajs} == {"content_platform_1/0", "content_platform_1/1"}
    rec = json.loads((out / "content_platform_1_task0.jsonl").read_text().splitlines()[0])
    assert len(rec["tools"]) == 34 and set(rec["tools"][0]) == {"name", "description", "inputSchema"}
    assert rec["steps"][-1]["action"] == {"tool_name": "verify",
                                          "arguments": {"verifier_mode": "code", "final_answer": "Subscribed."}}
    log = (out / "capture_log.txt").read_text()
    assert "episodes/s" in log and "containment:" in log
    err = capsys.readouterr().err
    assert "outcomes:" in err


def test_capture_cli_errors(tmp_path, capsys):
    data = _samples()
    assert cli(["capture", "--data", str(data), "--scenario", "e_commerce_33", "--task-idx", "0", "--policy",
                "replay:" + str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o")]) == 2
    assert "replay file not found" in capsys.readouterr().err
    (tmp_path / "r.jsonl").write_text(json.dumps({"task_idx": 0, "calls": []}) + "\n")
    assert cli(["capture", "--data", str(data), "--scenario", "e_commerce_33", "--policy",
                f"replay:{tmp_path / 'r.jsonl'}", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "scenario 'e_commerce_33'" in err and "env_code" in err  # no server code in the sample
    assert cli(["capture", "--data", str(data), "--scenario", "content_platform_1", "--task-idx", "12",
                "--policy", f"replay:{tmp_path / 'r.jsonl'}", "--output", str(tmp_path / "o")]) == 2
    assert "task_idx 12 out of range" in capsys.readouterr().err


def test_capture_cli_model_policy_records_logprobs(tmp_path):
    data = _samples()
    from echo_trl.tiny import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny", family="qwen3", hidden_size=32, vocab_size=512)
    out = tmp_path / "out"
    rc = cli(["capture", "--data", str(data), "--scenario", "content_platform_1", "--task-idx", "1", "--policy",
              f"model:{model}", "--episodes", "2", "--max-new-tokens", "24", "--max-steps", "2", "--output", str(out)])
    assert rc == 0
    records = [json.loads(x) for x in (out / "content_platform_1_task1.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for rec in records:
        generated = [s["policy"] for s in rec["steps"] if "policy" in s]
        assert generated, rec["steps"]
        assert len(rec["behavior_logprobs"]) == sum(len(g["token_ids"]) for g in generated) > 0
        assert all(lp <= 0.0 for lp in rec["behavior_logprobs"])
        assert all(len(g["logprobs"]) == len(g["token_ids"]) for g in generated)
        assert rec["steps"][-1]["observation"]["done"]
    trajs, skipped = load_awm_episodes([out])
    assert len(trajs) == 2 and not skipped and trajs[0].behavior_logprobs == records[0]["behavior_logprobs"]
