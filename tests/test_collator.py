"""Role-aware collation (offline) and the online tool-content mask, without a model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import tiny_tokenizer

from echo_trl.collator import (
    CollatorSettings,
    collate_features,
    group_advantages,
    is_error_output,
    rollout_quality,
    tool_content_mask,
    trajectory_features,
)
from echo_trl.errors import DatasetSchemaError
from echo_trl.roles import Trajectory, tool_call
from echo_trl.tokenization import tokenize_with_roles


def traj(outputs=("{\"items\": [1, 2]}", "Error: no such product"), warnings=None, behavior=None,
         tools=("search", "add"), reward=1.0, group="g"):
    completion = []
    for i, out in enumerate(outputs):
        completion.append({"role": "assistant", "content": "",
                           "tool_calls": [tool_call(tools[i % len(tools)], {"q": f"x{i}"})]})
        completion.append({"role": "tool", "name": tools[i % len(tools)], "content": out})
    ws = warnings or [[] for _ in completion]
    return Trajectory(
        prompt=[{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Buy a lamp."}],
        completion=completion, warnings=ws, reward=reward, group_id=group, scenario="shop", task_idx=0,
        tools=[{"type": "function", "function": {"name": n, "description": "", "parameters": {
            "type": "object", "properties": {"q": {"type": "string"}}}}} for n in tools],
        behavior_logprobs=behavior)


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3", "llama3_1"])
def test_features_split_the_exact_tokenization(family):
    tok = tiny_tokenizer(family)
    t = traj(warnings=[[], ["harness: slow down"], [], []])
    f = trajectory_features(tok, t, CollatorSettings())
    ref = tokenize_with_roles(tok, t)
    assert f.prompt_ids + f.completion_ids == ref.input_ids  # no re-tokenization, no drift
    p = ref.prompt_length
    assert f.action_mask == ref.action_mask[p:] and f.env_output_mask == ref.env_output_mask[p:]
    assert f.warning_mask == ref.warning_mask[p:] and f.world_mask == f.env_output_mask
    assert sum(ref.env_output_mask[:p]) == 0 and sum(ref.action_mask[:p]) == 0
    assert sum(f.warning_mask) > 0 and sum(f.env_output_mask) > 0
    # the env-output tokens are exactly the tool outputs' text
    env_text = tok.decode([i for i, m in zip(f.completion_ids, f.env_output_mask, strict=True) if m])
    assert "no such product" in env_text and "items" in env_text and "harness" not in env_text


def test_world_target_all_includes_warnings_and_cap_limits_each_observation():
    tok = tiny_tokenizer("qwen3")
    t = traj(warnings=[[], ["harness: slow down"], [], []])
    f_all = trajectory_features(tok, t, CollatorSettings(world_loss_target="all"))
    assert all(w for w, m in zip(f_all.world_mask, f_all.warning_mask, strict=True) if m)
    f_cap = trajectory_features(tok, t, CollatorSettings(max_world_model_tokens=2))
    assert sum(f_cap.world_mask) == 4  # 2 observations x 2 tokens
    env = np.asarray(f_cap.env_output_mask)
    first_run = np.flatnonzero(env)[:2]
    assert all(f_cap.world_mask[i] for i in first_run)


def test_filters_gate_only_the_world_term():
    tok = tiny_tokenizer("qwen3")
    t = traj()  # 1 of 2 tool results is an error: correct_pct = 50
    f = trajectory_features(tok, t, CollatorSettings(min_correct_pct=60))
    assert not f.passes and sum(f.world_mask) == 0
    assert sum(f.action_mask) > 0 and sum(f.env_output_mask) > 0  # policy tokens and metrics untouched
    assert trajectory_features(tok, t, CollatorSettings(min_correct_pct=50)).passes


def test_rollout_quality():
    t = traj(outputs=("ok", "Error: boom", "{\"error\": \"bad id\"}", "{'error': 'Tool x not found.'}"),
             tools=("search", "add", "nope", "add"))
    t.tools = t.tools[:2]  # "nope" is not offered
    t.warnings[3] = ["format warning"]
    q = rollout_quality(t.completion, t.tools, t.warnings)
    assert q == {"valid_tool_call_pct": 75.0, "parse_clean_pct": 75.0, "correct_pct": 25.0}
    assert rollout_quality([], []) == {"valid_tool_call_pct": 100.0, "parse_clean_pct": 100.0, "correct_pct": 100.0}
    assert not is_error_output('{"error": null, "items": []}') and is_error_output("error: x")


def test_behavior_logprobs_align_to_action_tokens_and_mismatch_is_an_error():
    tok = tiny_tokenizer("qwen3")
    n_action = sum(tokenize_with_roles(tok, traj()).action_mask)
    values = [-0.1 * (i + 1) for i in range(n_action)]
    f = trajectory_features(tok, traj(behavior=values), CollatorSettings())
    placed = [v for v, a in zip(f.behavior_logps, f.action_mask, strict=True) if a]
    assert placed == pytest.approx(values)
    assert all(math.isnan(v) for v, a in zip(f.behavior_logps, f.action_mask, strict=True) if not a)
    with pytest.raises(DatasetSchemaError, match="behavior_logprobs has 3 values"):
        trajectory_features(tok, traj(behavior=[-0.1, -0.2, -0.3]), CollatorSettings())


def test_truncation_cuts_at_message_end_and_is_reported():
    tok = tiny_tokenizer("qwen3")
    full = trajectory_features(tok, traj(), CollatorSettings())
    short = trajectory_features(tok, traj(), CollatorSettings(max_completion_length=len(full.completion_ids) - 1))
    assert len(short.completion_ids) < len(full.completion_ids)
    assert short.completion_ids == full.completion_ids[:len(short.completion_ids)]
    assert short.truncated_tokens == len(full.completion_ids) - len(short.completion_ids)


def test_collate_pads_like_trl():
    tok = tiny_tokenizer("qwen3")
    a = trajectory_features(tok, traj(outputs=("short",)), CollatorSettings())
    b = trajectory_features(tok, traj(), CollatorSettings())
    batch = collate_features([a, b], tok.pad_token_id)
    assert batch["prompt_mask"][0].tolist()[-1] == 1 and batch["completion_mask"][0].tolist()[0] == 1
    n = len(a.completion_ids)
    assert batch["completion_mask"][0].sum() == n and batch["completion_ids"][0, n:].eq(tok.pad_token_id).all()
    assert torch.equal(batch["tool_mask"][0, :n], torch.tensor(a.action_mask))
    assert batch["tool_mask"][0, n:].sum() == 0 and "old_per_token_logps" not in batch
    ids = torch.cat([batch["prompt_ids"][1][batch["prompt_mask"][1].bool()],
                     batch["completion_ids"][1][batch["completion_mask"][1].bool()]])
    assert ids.tolist() == b.prompt_ids + b.completion_ids


def test_group_advantages_follow_trl_formulas():
    rewards = [1.0, 0.0, 0.5, 1.0, 0.3]
    groups = ["a", "b", "a", "b", "c"]
    adv = group_advantages(rewards, groups, "group")
    # group a: mean .75, std(ddof=1) = .35355; group b: mean .5, std .70711; c alone: 0
    assert adv == pytest.approx([0.25 / (0.353553 + 1e-4), -0.5 / (0.707107 + 1e-4), -0.25 / (0.353553 + 1e-4),
                                 0.5 / (0.707107 + 1e-4), 0.0], rel=1e-5)
    none = group_advantages(rewards, groups, "none")
    assert none == pytest.approx([0.25, -0.5, -0.25, 0.5, 0.0])
    batch = group_advantages(rewards, groups, "batch")
    assert batch == pytest.approx(none / (np.std(rewards, ddof=1) + 1e-4))
    assert group_advantages([1.0, 1.0], ["x", "x"], "group") == pytest.approx([0.0, 0.0])


# --------------------------------------------------------------------------------------------
# Online: content-only env mask inside TRL's tool_mask == 0 spans (TRL's own suffix builder)


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3", "llama3_1"])
def test_online_mask_is_the_tool_content_only(family):
    from trl import GRPOTrainer
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    from echo_trl.trl_compat import render_tool_suffix

    tok = tiny_tokenizer(family)
    # what GRPOTrainer.__init__ sets up for tool training (a prefix-preserving training template if needed)
    template = None if is_chat_template_prefix_preserving(tok) else get_training_chat_template(tok)
    fake = SimpleNamespace(processing_class=tok, _tokenizer=tok, chat_template=template, chat_template_kwargs={},
                           _is_vlm=False)
    messages = [{"role": "assistant", "content": "", "tool_calls": [tool_call("search", {"q": "lamp"})]},
                {"role": "tool", "name": "search", "content": "user assistant tool_response 42 lamps"},
                {"role": "assistant", "content": "", "tool_calls": [tool_call("add", {"id": 4}),
                                                                     tool_call("add", {"id": 5})]},
                {"role": "tool", "name": "add", "content": "added 4"},
                {"role": "tool", "name": "add", "content": "{'error': 'out of stock'}"},
                {"role": "assistant", "content": "done"}]
    ids, tmask = [], []
    for chunk in ([11, 12, 13], None, [14, 15], None, [16]):  # model tokens, then TRL's tool suffix ids
        if chunk is None:
            group = [m for m in messages if m["role"] == "tool"]
            group = group[:1] if not ids or len(tmask) < 6 else group[1:]
            suffix = GRPOTrainer._get_tool_suffix_ids(fake, group)
            ids += suffix
            tmask += [0] * len(suffix)
        else:
            ids += chunk
            tmask += [1] * len(chunk)
    mask = tool_content_mask(tok, ids, tmask, messages, lambda msgs: render_tool_suffix(fake, msgs))
    assert mask is not None
    env_text = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    for content in ("user assistant tool_response 42 lamps", "added 4", "{'error': 'out of stock'}"):
        assert content in env_text.replace('\\"', '"')
    assert all(t == 0 for t, m in zip(tmask, mask, strict=True) if m)  # inside the spans only
    # role headers, <tool_response> tags and the next generation prompt are not env output
    outside = tok.decode([i for i, m, t in zip(ids, mask, tmask, strict=True) if not m and t == 0])
    assert "lamps" not in outside and "added" not in outside and "stock" not in outside
    assert len(outside) > 10


def test_online_mask_refuses_misaligned_spans():
    tok = tiny_tokenizer("qwen3")
    messages = [{"role": "assistant", "content": ""}, {"role": "tool", "name": "t", "content": "abc"}]
    assert tool_content_mask(tok, [1, 2, 3], [1, 1, 1], messages, lambda m: "") is None  # 1 group, 0 spans


def test_real_captured_awm_episode(captured_episode):
    import json

    from echo_trl.awm import awm_episode_to_trajectory

    t = awm_episode_to_trajectory(json.loads(captured_episode.read_text()))
    tok = tiny_tokenizer("qwen2_5")
    f = trajectory_features(tok, t, CollatorSettings())
    assert sum(f.env_output_mask) > 10 * sum(f.action_mask) > 0  # AWM observations dwarf the actions
    assert f.quality["valid_tool_call_pct"] == 100.0 and f.passes
    env_text = tok.decode([i for i, m in zip(f.completion_ids, f.env_output_mask, strict=True) if m])
    assert "Bose QuietComfort" in env_text and "<tool_response>" not in env_text
