"""``echo-trl capture``: replay and model policies -> episodes that build-dataset reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_trl.commands.cli import main as cli
from echo_trl.data.readers.records import load_awm_episodes
from echo_trl.envs.awm.policies.policy import PolicyError
from echo_trl.envs.awm.policies.replay import ReplayPolicy

SAMPLES = Path(__file__).resolve().parents[5] / "shared" / "data" / "awm1k_samples"

SCRIPTS = [
    {
        "task_idx": 0,
        "label": "reference",
        "calls": [
            {"tool_name": "search_channels", "arguments": {"query": "Kurzgesagt"}},
            {"tool_name": "subscribe_to_channel", "arguments": {"channel_id": 1}},
        ],
        "final_answer": "Subscribed.",
    },
    {"task_idx": 0, "label": "unknown tool", "calls": [{"tool": "subscribe", "args": {"channel": "Kurzgesagt"}}]},
    {"task_idx": 1, "label": "wrong args", "calls": [{"tool_name": "search_channels", "arguments": {"query": 3}}]},
    {
        "task_idx": 1,
        "label": "stops early",
        "calls": [{"tool_name": "search_channels", "arguments": {"query": "Marques"}}],
        "verify": False,
    },
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
    rc = cli(
        [
            "capture",
            "--data",
            str(data),
            "--scenario",
            "content_platform_1",
            "--policy",
            f"replay:{replay}",
            "--episodes",
            "2",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    files = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert files == [
        "capture_log.txt",
        "capture_state.json",
        "capture_summary.json",
        "content_platform_1_task0.jsonl",
        "content_platform_1_task1.jsonl",
    ]
    trajs, skipped = load_awm_episodes([out])
    assert not skipped and len(trajs) == 4
    assert [t.reward for t in trajs] == [0.0, -1.0, -1.0, 0.0]  # no verifier in the sample -> 0.0
    assert {t.group_id for t in trajs} == {"content_platform_1/0", "content_platform_1/1"}
    rec = json.loads((out / "content_platform_1_task0.jsonl").read_text().splitlines()[0])
    assert rec["metadata"]["episode"] == {"key": "content_platform_1/0/0", "index": 0}
    assert len(rec["tools"]) == 34 and set(rec["tools"][0]) == {"name", "description", "inputSchema"}
    assert rec["steps"][-1]["action"] == {
        "tool_name": "verify",
        "arguments": {"verifier_mode": "code", "final_answer": "Subscribed."},
    }
    log = (out / "capture_log.txt").read_text()
    assert "episodes/s" in log and "containment:" in log
    err = capsys.readouterr().err
    assert "outcomes:" in err


def test_capture_cli_errors(tmp_path, capsys):
    data = _samples()
    assert (
        cli(
            [
                "capture",
                "--data",
                str(data),
                "--scenario",
                "e_commerce_33",
                "--task-idx",
                "0",
                "--policy",
                "replay:" + str(tmp_path / "missing.jsonl"),
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "replay file not found" in capsys.readouterr().err
    (tmp_path / "r.jsonl").write_text(json.dumps({"task_idx": 0, "calls": []}) + "\n")
    assert (
        cli(
            [
                "capture",
                "--data",
                str(data),
                "--scenario",
                "e_commerce_33",
                "--policy",
                f"replay:{tmp_path / 'r.jsonl'}",
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "scenario 'e_commerce_33'" in err and "env_code" in err  # no server code in the sample
    assert (
        cli(
            [
                "capture",
                "--data",
                str(data),
                "--scenario",
                "content_platform_1",
                "--task-idx",
                "12",
                "--policy",
                f"replay:{tmp_path / 'r.jsonl'}",
                "--output",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    assert "task_idx 12 out of range" in capsys.readouterr().err


def test_capture_cli_model_policy_records_logprobs(tmp_path):
    data = _samples()
    from echo_trl.demo.tiny import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny", family="qwen3", hidden_size=32, vocab_size=512)
    out = tmp_path / "out"
    rc = cli(
        [
            "capture",
            "--data",
            str(data),
            "--scenario",
            "content_platform_1",
            "--task-idx",
            "1",
            "--policy",
            f"model:{model}",
            "--episodes",
            "2",
            "--max-new-tokens",
            "24",
            "--max-steps",
            "2",
            "--output",
            str(out),
            "--system-prompt",
            'Reply in JSON like {"tool": ...} in {scenario}.',
        ]
    )  # braces are text
    assert rc == 0
    records = [json.loads(x) for x in (out / "content_platform_1_task1.jsonl").read_text().splitlines()]
    assert len(records) == 2
    summary = json.loads((out / "capture_summary.json").read_text())["logprobs"]
    flagged = 0
    for rec in records:
        generated = [s["policy"] for s in rec["steps"] if "policy" in s]
        assert generated, rec["steps"]
        assert all(len(g["logprobs"]) == len(g["token_ids"]) > 0 for g in generated)
        assert all(lp <= 0.0 for g in generated for lp in g["logprobs"])
        assert rec["steps"][-1]["observation"]["done"]
        # a random tiny model's turns rarely survive re-rendering (no end-of-turn token, text the dataset drops):
        # each turn is compared with the trainer's tokens, and an episode keeps its log-probs only when all agree
        check = rec["sampler"]["alignment"]
        assert check["tokenizer"] == str(model) and check["status"] in ("aligned", "flagged")
        if check["status"] == "aligned":
            assert rec["behavior_logprobs"] == [lp for g in generated for lp in g["logprobs"]]
        else:
            assert "behavior_logprobs" not in rec and check["flagged"]
            assert all("token" in f["reason"] or "message" in f["reason"] for f in check["flagged"])
        flagged += len(check["flagged"])
    assert summary["turns_flagged"] == flagged and summary["turns"] == sum(
        len([s for s in r["steps"] if "policy" in s]) for r in records
    )
    trajs, skipped = load_awm_episodes([out])
    assert len(trajs) == 2 and not skipped
    assert [t.behavior_logprobs for t in trajs] == [r.get("behavior_logprobs") for r in records]


# -- replaying recorded episodes -----------------------------------------------------------------

LIBRARY = Path(__file__).resolve().parents[4] / "data" / "awm_scenarios"


def test_normalize_timestamps():
    from echo_trl.envs.awm.policies.replay_check import normalize_timestamps

    text = (
        '{"created_at": "2025-09-09T03:51:08", "at": "2026-06-14 03:51:08.123456+00:00", "z": "2025-01-02T03:04Z", '
        '"due": "2025-04-04", "isbn": "9781991900371", "range": "12025-04-04", "phone": "555-318-4410"}'
    )
    assert normalize_timestamps(text) == (
        '{"created_at": "<datetime>", "at": "<datetime>", "z": "<datetime>", "due": "<date>", '
        '"isbn": "9781991900371", "range": "12025-04-04", "phone": "555-318-4410"}'
    )
    assert normalize_timestamps("no dates") == "no dates"


def test_recorded_episodes_become_scripts(tmp_path, captured_episode):
    from echo_trl.envs.awm.policies.replay import is_recorded_episode

    rec = json.loads(captured_episode.read_text())
    assert is_recorded_episode(rec) and not is_recorded_episode(SCRIPTS[0])
    (script,) = ReplayPolicy.from_file(captured_episode).scripts
    assert script.scenario == "e_commerce_33" and script.task_idx == 0 and script.verify
    assert [c[0] for c in script.calls] == [s["action"]["tool_name"] for s in rec["steps"][:-1]]
    assert len(script.expected) == len(rec["steps"])  # every recorded observation, the verifier's included
    # AWM's trajectory.json: list_tools is context, call_tool steps are replayed, verify is the verifier
    traj = {
        "scenario": "library_1",
        "task": "t",
        "task_idx": 3,
        "steps": 3,
        "trajectory": [
            {"action": "list_tools", "result": {"tools": []}},
            {
                "action": "call_tool",
                "tool_name": "search_members",
                "arguments": '{"query": "Priya"}',
                "success": True,
                "result": "{}",
            },
            {
                "action": "verify",
                "arguments": {"final_answer": "done"},
                "verify_result": {"result": "complete"},
                "reward": 1.0,
            },
        ],
    }
    (tmp_path / "trajectory.json").write_text(json.dumps(traj))
    (s,) = ReplayPolicy.from_file(tmp_path).scripts
    assert (s.task_idx, s.calls, s.final_answer, s.verify) == (
        3,
        [("search_members", {"query": "Priya"})],
        "done",
        True,
    )
    (tmp_path / "bad.jsonl").write_text(
        json.dumps({**rec, "steps": [{"action": {"tool_name": 3}, "observation": {}}]})
    )
    with pytest.raises(PolicyError, match=r"bad.jsonl:1: steps\[0\].action.tool_name: expected a string"):
        ReplayPolicy.from_file(tmp_path / "bad.jsonl")


def test_replaying_captured_episodes_reproduces_every_observation(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    base = ["capture", "--data", str(LIBRARY), "--scenario", "library_1", "--task-idx", "0", "--task-idx", "4"]
    # the first capture reads its flags from `--config cfg.yaml` (the command line adds --output)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"data: {LIBRARY}\nscenario: [library_1]\ntask_idx: [0, 4]\n"
        f"policy: replay:{LIBRARY / 'solutions.jsonl'}\nepisodes: 6\nseed: 7\n"
    )
    assert cli(["capture", "--config", str(cfg), "--output", str(first)]) == 0
    recorded = [json.loads(x) for f in sorted(first.glob("*.jsonl")) for x in f.read_text().splitlines()]
    assert len(recorded) == 12 and {r["reward"] for r in recorded} == {1.0, 0.0, -1.0}
    assert {r["task_idx"] for r in recorded} == {0, 4}
    assert json.loads((first / "capture_state.json").read_text())["settings"]["seed"] == 7
    assert cli([*base, "--policy", f"replay:{first}", "--output", str(again)]) == 0
    replayed = [json.loads(x) for f in sorted(again.glob("*.jsonl")) for x in f.read_text().splitlines()]
    assert len(replayed) == 12  # each recording once
    total = sum(len(r["steps"]) for r in recorded)
    assert all(s["replay_match"] for r in replayed for s in r["steps"])
    assert [r["reward"] for r in replayed] == [r["reward"] for r in recorded]
    log = (again / "capture_log.txt").read_text()
    assert f"replay check total: {total}/{total} live observations equal the recorded ones" in log
    # a recording that does not match the live scenario is reported step by step
    lines = (first / "library_1_task0.jsonl").read_text().splitlines()
    tampered = json.loads(lines[0])
    tampered["steps"][1]["observation"]["tool_result"] = tampered["steps"][1]["observation"]["tool_result"].replace(
        "Project Hail Mary", "Project Hail Marx"
    )
    tampered["steps"][3]["observation"]["reward_type"] = "tool_error"  # the classification, not the text
    tampered["steps"][3]["reward"] = -1.0
    (tmp_path / "t.jsonl").write_text(json.dumps(tampered) + "\n")
    assert cli([*base[:5], "--policy", f"replay:{tmp_path / 't.jsonl'}", "--output", str(tmp_path / "t")]) == 0
    log = (tmp_path / "t" / "capture_log.txt").read_text()
    n = len(tampered["steps"])
    assert (
        f"{n - 2}/{n} same [1:same 2:DIFFERENT(observation text) 3:same "
        "4:DIFFERENT(reward_type tool_error -> tool_call_ok; reward -1.0 -> 0.0)"
    ) in log


def test_a_mid_episode_format_error_is_captured_in_full(tmp_path):
    script = {
        "task_idx": 0,
        "calls": [
            {"tool_name": "search_members", "arguments": {"query": "Priya Raman"}},
            {"tool_name": "checkout_copy", "arguments": {"member_id": "one", "barcode": "31994002104119"}},
            {"tool_name": "checkout_copy", "arguments": {"member_id": 1, "barcode": "31994002104119"}},
        ],
        "final_answer": "Checked out.",
    }
    replay = tmp_path / "r.jsonl"
    replay.write_text(json.dumps(script) + "\n")
    base = ["capture", "--data", str(LIBRARY), "--scenario", "library_1", "--policy", f"replay:{replay}"]
    assert cli([*base, "--output", str(tmp_path / "full")]) == 0
    rec = json.loads((tmp_path / "full" / "library_1_task0.jsonl").read_text())
    assert [s["observation"]["reward_type"] for s in rec["steps"]] == [
        "tool_call_ok",
        "invalid_args",
        "tool_call_ok",
        "complete",
    ]  # the task got done after the error ...
    assert rec["reward"] == -1.0 and rec["reward_type"] == "format_error"  # ... the reward stays -1.0, as in AWM
    assert rec["metadata"]["verifier_reward"] == 1.0
    assert cli([*base, "--stop-on-format-error", "--output", str(tmp_path / "stop")]) == 0
    rec = json.loads((tmp_path / "stop" / "library_1_task0.jsonl").read_text())
    assert [s["observation"]["reward_type"] for s in rec["steps"]] == ["tool_call_ok", "invalid_args"]
    assert rec["reward"] == -1.0
    assert cli([*base, "--verify-turn", "omit", "--output", str(tmp_path / "omit")]) == 0
    rec = json.loads((tmp_path / "omit" / "library_1_task0.jsonl").read_text())
    assert [s["action"]["tool_name"] for s in rec["steps"]] == ["search_members", "checkout_copy", "checkout_copy"]
    assert rec["verification"]["observation"]["reward_type"] == "complete"
    (traj,), _ = load_awm_episodes([tmp_path / "omit"])
    assert "verify" not in json.dumps(traj.completion) and traj.reward == -1.0


def test_capture_cli_model_policy_in_the_awm_agent_format(tmp_path):
    from echo_trl.demo.tiny import ensure_tiny_model

    model = ensure_tiny_model(tmp_path / "tiny", family="qwen3", hidden_size=32, vocab_size=512)
    out = tmp_path / "out"
    assert (
        cli(
            [
                "capture",
                "--data",
                str(LIBRARY),
                "--scenario",
                "library_1",
                "--task-idx",
                "0",
                "--policy",
                f"model:{model}",
                "--format",
                "awm-agent",
                "--max-new-tokens",
                "8",
                "--max-steps",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    rec = json.loads((out / "library_1_task0.jsonl").read_text())
    assert rec["metadata"]["format"] == "awm-agent"
    assert "verification" in rec and all(s["action"]["tool_name"] != "verify" for s in rec["steps"])  # omit default
    assert rec["verification"]["action"]["tool_name"] == "verify" and rec["verification"]["policy"]["logprobs"]
    # log-probs kept only when every sampled turn is the trainer's tokens (the list_tools turn the awm-agent
    # conversation opens with is one the model must have written): else flagged, never partly kept
    check = rec["sampler"]["alignment"]
    assert (check["status"] == "aligned") == ("behavior_logprobs" in rec) and check["status"] in ("aligned", "flagged")
    assert "verifier turn: omit" in (out / "capture_log.txt").read_text()


def test_a_live_episode_and_the_dataset_built_from_its_recording_render_the_same_prompt(tmp_path):
    """What a model policy is shown live is what training on the recording renders: same text, same ids."""
    from helpers.tiny import TEMPLATE_FAMILIES, tiny_tokenizer

    from echo_trl.data.build import build_awm_dataset
    from echo_trl.data.readers.prompt import DEFAULT_SYSTEM_PROMPT
    from echo_trl.envs.awm.policies.policy import live_prompt, play_episode
    from echo_trl.envs.awm.policies.replay import Script
    from echo_trl.envs.awm.runtime.episode import AWMRuntime
    from echo_trl.envs.awm.scenario.source import ScenarioSource
    from echo_trl.tokens.tokenization import tokenize_with_roles

    scenario = ScenarioSource.from_dir(LIBRARY).load("library_1")
    replay = ReplayPolicy([Script(0, [("search_members", {"query": "Priya Raman"})], final_answer="Found her.")])
    with AWMRuntime(scenario) as runtime:
        described = runtime.tools[1]
        runtime.tools[0] = {**runtime.tools[0], "description": None}  # MCP makes a tool's description optional
        episode = runtime.new_episode(0)
        messages, tools = live_prompt(DEFAULT_SYSTEM_PROMPT, episode)  # what ModelPolicy.play starts with
        record = play_episode(replay, episode)
    (tmp_path / "episodes.jsonl").write_text(json.dumps(record) + "\n")  # as capture writes it
    row = build_awm_dataset([tmp_path / "episodes.jsonl"])[0]

    assert [m["content"] for m in messages] == [m["content"] for m in row["prompt"]]
    assert messages[0]["content"] == DEFAULT_SYSTEM_PROMPT.replace("{scenario}", "library_1")
    assert tools == [json.loads(t) for t in row["tools"]]
    assert tools[0]["function"]["description"] == "" and record["tools"][0]["description"] is None
    assert tools[1]["function"] == {
        "name": described["name"],
        "description": described["description"],
        "parameters": described["inputSchema"],
    }
    for family in TEMPLATE_FAMILIES:
        tok = tiny_tokenizer(family)
        live_text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        live_ids = tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        trained = tokenize_with_roles(tok, row)
        assert trained.text.startswith(live_text), family
        assert trained.input_ids[: trained.prompt_length] == list(live_ids), family
