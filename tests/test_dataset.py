"""The typed trajectory dataset: schema, round trips, determinism, loading paths and the card."""

from __future__ import annotations

import json

import datasets
import pytest
from test_awm import openenv_episode, session_episode

from echo_trl.awm import awm_episode_to_trajectory
from echo_trl.dataset import (
    FEATURES,
    build_awm_dataset,
    load_echo_dataset,
    row_to_trajectory,
    save_dataset,
    trajectories_to_dataset,
    validate_dataset,
)
from echo_trl.errors import DatasetSchemaError, EpisodeError


@pytest.fixture
def episode_dir(tmp_path):
    d = tmp_path / "episodes"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(openenv_episode()))
    (d / "b.json").write_text(json.dumps(session_episode()))
    (d / "c.jsonl").write_text("\n".join(json.dumps(openenv_episode(task_idx=i, reward=r))
                                         for i, r in [(5, 1.0), (5, 0.1)]) + "\n")
    return d


def test_rows_have_the_explicit_schema_and_round_trip(episode_dir):
    ds = build_awm_dataset([episode_dir])
    assert ds.features == FEATURES and len(ds) == 4
    originals = [awm_episode_to_trajectory(openenv_episode()), awm_episode_to_trajectory(session_episode())]
    for row, original in zip(ds, originals, strict=False):
        back = row_to_trajectory(row)
        assert back.messages == original.messages  # tool-call arguments come back as objects
        assert back.tools == original.tools and back.warnings == original.warnings
        assert (back.reward, back.group_id) == (original.reward, original.group_id)
    assert ds[2]["group_id"] == ds[3]["group_id"] == "shop_1/5"


def test_build_is_deterministic(episode_dir):
    a, b = build_awm_dataset([episode_dir]), build_awm_dataset([episode_dir])
    assert a.to_list() == b.to_list()
    assert a["task_idx"] == [2, 0, 5, 5]  # sorted files, file order within


def test_rows_are_trl_conversational(episode_dir):
    from trl.data_utils import is_conversational

    from echo_trl.tiny import build_tiny_tokenizer

    row = build_awm_dataset([episode_dir])[0]
    assert is_conversational(row)
    tok = build_tiny_tokenizer("qwen2_5")
    back = row_to_trajectory(row)
    text = tok.apply_chat_template(back.messages, tools=back.tools, tokenize=False)
    assert '"arguments": {"q": "notebook"}' in text


def test_lenient_build_keeps_valid_rows(episode_dir):
    (episode_dir / "d.jsonl").write_text('{"broken": \n' + json.dumps(openenv_episode(task_idx=9)) + "\n")
    with pytest.raises(EpisodeError, match=r"d.jsonl:1: invalid JSON"):
        build_awm_dataset([episode_dir])
    skipped = []
    ds = build_awm_dataset([episode_dir], strict=False, skipped=skipped)
    assert len(ds) == 5 and ds["task_idx"][-1] == 9
    assert [(s.record, s.raw) for s in skipped] == [("1", '{"broken": ')]


def test_save_load_and_parquet_paths(episode_dir, tmp_path):
    ds = build_awm_dataset([episode_dir])
    out = save_dataset(ds, tmp_path / "ds")
    assert load_echo_dataset(out).to_list() == ds.to_list()
    # The Hub path: load_dataset on data files (what a pushed repo holds), cast back to our schema.
    pq = tmp_path / "hub_like" / "data"
    pq.mkdir(parents=True)
    ds.to_parquet(str(pq / "train-00000-of-00001.parquet"))
    loaded = load_echo_dataset(tmp_path / "hub_like")
    assert loaded.features == FEATURES and loaded.to_list() == ds.to_list()


def test_dataset_card_counts_roles_and_attributes_awm(episode_dir, tmp_path):
    ds = build_awm_dataset([episode_dir])
    card = (save_dataset(ds, tmp_path / "ds") / "README.md").read_text()
    assert "license: cc-by-4.0" in card and "arXiv 2602.10090" in card and "2605.24517" in card
    n_tool_msgs = sum(m["role"] == "tool" for row in ds for m in row["completion"])
    assert f"| `env_output` | {n_tool_msgs} |" in card
    assert "| shop_1 | 4 | 3 |" in card  # 4 episodes, 3 distinct tasks


def test_schema_validation_names_columns():
    ds = trajectories_to_dataset([awm_episode_to_trajectory(openenv_episode())])
    with pytest.raises(DatasetSchemaError, match="missing column.*completion"):
        validate_dataset(ds.remove_columns(["completion"]), "my_ds")
    bad = datasets.Dataset.from_dict({**ds.remove_columns(["reward"]).to_dict(), "reward": [["x"]]})
    with pytest.raises(DatasetSchemaError, match="reward"):
        validate_dataset(bad)
    no_logprobs = ds.remove_columns(["behavior_logprobs"])
    assert validate_dataset(no_logprobs).features == FEATURES


def test_format_is_recorded_and_chosen_per_build(episode_dir, tmp_path):
    from echo_trl.awm_agent import SYSTEM_PROMPT

    (episode_dir / "a.json").write_text(json.dumps(openenv_episode(tools=[
        {"name": "search", "description": "Search.", "inputSchema": {}},
        {"name": "add_to_cart", "description": "Add.", "inputSchema": {}}])))
    (episode_dir / "c.jsonl").unlink()
    plain = build_awm_dataset([episode_dir])
    agent = build_awm_dataset([episode_dir], format="awm-agent")
    assert plain["format"] == ["chat-template"] * 2 and agent["format"] == ["awm-agent"] * 2
    assert agent.features == FEATURES
    assert [r["prompt"][0]["content"] for r in agent] == [SYSTEM_PROMPT] * 2
    names = [[c["function"]["name"] for m in r["completion"] for c in m["tool_calls"] or []] for r in agent]
    assert names == [["list_tools", "call_tool", "call_tool"], ["list_tools", "call_tool", "call_tool"]]
    with_verifier = build_awm_dataset([episode_dir], format="awm-agent", verify_turn="env_output")
    assert [len(r["completion"]) for r in with_verifier] == [len(r["completion"]) + 1 for r in agent]
    save_dataset(agent, tmp_path / "ds")
    assert load_echo_dataset(tmp_path / "ds")["format"] == ["awm-agent"] * 2
    assert "Conversation format: `awm-agent`" in (tmp_path / "ds" / "README.md").read_text()
    with pytest.raises(ValueError, match="unknown format 'chat'"):
        build_awm_dataset([episode_dir], format="chat")


def test_datasets_built_before_formats_load_as_chat_template(episode_dir):
    old = build_awm_dataset([episode_dir]).remove_columns("format")
    assert validate_dataset(old)["format"] == ["chat-template"] * 4


def test_verify_turn_omit_in_chat_template_keeps_the_final_answer():
    ep = openenv_episode()
    ep["steps"][-1]["action"]["arguments"]["final_answer"] = "Added."
    kept = awm_episode_to_trajectory(ep)
    omitted = awm_episode_to_trajectory(ep, verify_turn="omit")
    assert kept.completion[-2]["tool_calls"][0]["function"]["name"] == "verify"
    assert omitted.completion[:-1] == kept.completion[:-2]
    assert omitted.completion[-1] == {"role": "assistant", "content": "Added."}
    with pytest.raises(ValueError, match="unknown verify_turn"):
        awm_episode_to_trajectory(ep, verify_turn="hide")
