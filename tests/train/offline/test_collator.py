"""Offline collation of recorded trajectories, without a model."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from helpers.episodes import traj
from helpers.tiny import tiny_tokenizer

from echo_trl.errors import DatasetSchemaError
from echo_trl.tokens.tokenization import TruncationError, tokenize_with_roles
from echo_trl.train.offline.collator import CollatorSettings, collate_features, trajectory_features


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
    assert short.completion_ids == full.completion_ids[: len(short.completion_ids)]
    assert short.truncated_tokens == len(full.completion_ids) - len(short.completion_ids)


def test_a_prompt_longer_than_max_length_names_the_trajectory_its_scenario_and_the_ways_out():
    tok = tiny_tokenizer("qwen3")
    t = traj()
    prompt = tokenize_with_roles(tok, t).prompt_length
    with pytest.raises(TruncationError) as exc:
        trajectory_features(tok, t, CollatorSettings(max_length=prompt - 1))
    message = str(exc.value)
    assert message.startswith(f"trajectory {t.group_id!r} (scenario {t.scenario!r}): the prompt alone has {prompt}")
    assert f"more than max_length={prompt - 1}" in message
    assert "(the model's context length)" in message and "--compact_tools" in message and "\n" not in message
    assert "--max_length" not in message  # train has no such flag: its max_length is the model's context


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
    ids = torch.cat(
        [
            batch["prompt_ids"][1][batch["prompt_mask"][1].bool()],
            batch["completion_ids"][1][batch["completion_mask"][1].bool()],
        ]
    )
    assert ids.tolist() == b.prompt_ids + b.completion_ids


def test_real_captured_awm_episode(captured_episode):
    import json

    from echo_trl.data.readers.records import awm_episode_to_trajectory

    t = awm_episode_to_trajectory(json.loads(captured_episode.read_text()))
    tok = tiny_tokenizer("qwen2_5")
    f = trajectory_features(tok, t, CollatorSettings())
    assert sum(f.env_output_mask) > 10 * sum(f.action_mask) > 0  # AWM observations dwarf the actions
    assert f.quality["valid_tool_call_pct"] == 100.0 and f.passes
    env_text = tok.decode([i for i, m in zip(f.completion_ids, f.env_output_mask, strict=True) if m])
    assert "Bose QuietComfort" in env_text and "<tool_response>" not in env_text


def test_context_length_bounds_the_whole_trajectory_at_a_message_end():
    tok = tiny_tokenizer("qwen3")
    t = traj(outputs=("x " * 300, "y " * 300, "z " * 300))
    full = tokenize_with_roles(tok, t)
    bound = full.prompt_length + (len(full.input_ids) - full.prompt_length) // 2
    f = trajectory_features(tok, t, CollatorSettings(max_length=bound))
    expected = full.truncate(bound)
    assert f.completion_ids == list(expected.input_ids[expected.prompt_length :])
    assert 0 < f.truncated_tokens == len(full.input_ids) - len(expected.input_ids)
    # the tighter of the two bounds wins; neither set keeps the whole completion
    both = trajectory_features(tok, t, CollatorSettings(max_length=bound, max_completion_length=10_000))
    assert both.completion_ids == f.completion_ids
    whole = trajectory_features(tok, t, CollatorSettings())
    assert len(whole.completion_ids) == len(full.input_ids) - full.prompt_length and whole.truncated_tokens == 0


@pytest.mark.parametrize(
    "settings",
    [
        CollatorSettings(),
        CollatorSettings(max_completion_length=20),
        CollatorSettings(world_loss_target="all", max_world_model_tokens=3, max_completion_length=33),
    ],
    ids=["whole", "cut", "all-capped"],
)
def test_features_from_the_token_cache_equal_fresh_tokenization(settings, monkeypatch, tmp_path):
    """The trainer's rows carry cached tokens (echo_trl.tokens.cache): their features are the fresh ones, cuts,
    targets and caps included, and building them renders nothing."""
    import echo_trl.train.offline.collator as collator_module
    from echo_trl.data.build import trajectories_to_dataset
    from echo_trl.tokens.cache import tokenize_dataset

    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path))

    tok = tiny_tokenizer("qwen3")
    trajectories = [
        traj(warnings=[[], ["harness: slow down"], [], []], behavior=None),
        traj(outputs=("a" * 50, "b", "c"), reward=0.0),
    ]
    ds = trajectories_to_dataset(trajectories)
    rows, cached = list(ds), list(tokenize_dataset(ds, tok, show_progress=False))
    fresh = [trajectory_features(tok, row, settings) for row in rows]
    monkeypatch.setattr(collator_module, "tokenize_with_roles", lambda *a, **k: pytest.fail("rendered a row"))
    monkeypatch.setattr(collator_module, "row_to_trajectory", lambda *a, **k: pytest.fail("decoded a row"))
    from_cache = [trajectory_features(tok, row, settings) for row in cached]
    assert from_cache == fresh
    if settings.max_completion_length:
        assert all(f.truncated_tokens > 0 for f in from_cache)


def test_a_datasets_quality_columns_override_the_cached_quality(monkeypatch, tmp_path):
    """The quality the token cache stores is the messages' own; a dataset's ``correct_pct`` column (where not null)
    overrides it, with or without the cache, and decides the world-term filter."""
    from echo_trl.data.build import trajectories_to_dataset
    from echo_trl.tokens.cache import tokenize_dataset

    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path))
    tok = tiny_tokenizer("qwen3")
    ds = trajectories_to_dataset([traj(), traj()])  # 1 of 2 tool results an error: correct_pct 50
    ds = ds.add_column("correct_pct", [None, 90.0])
    settings = CollatorSettings(min_correct_pct=60)
    for rows in (list(ds), list(tokenize_dataset(ds, tok, show_progress=False))):
        derived, overridden = (trajectory_features(tok, row, settings) for row in rows)
        assert derived.quality["correct_pct"] == 50.0 and not derived.passes and sum(derived.world_mask) == 0
        assert overridden.quality["correct_pct"] == 90.0 and overridden.passes and sum(overridden.world_mask) > 0


@pytest.mark.parametrize(
    "bad, problem",
    [(math.nan, "NaN is not a log-prob"), (-1e30, "-1e+30 is below the floor -50"), (50.0, "50 is above 0")],
)
def test_a_recorded_behavior_logprob_out_of_range_is_refused_where_it_enters_the_loss(bad, problem):
    """NaN marks "not recorded" in the batch (the trainer fills in the policy's own: ratio 1), so a recorded NaN
    must never reach it; rows given in Python reach the collator without the dataset-level check."""
    from echo_trl.data.schema import trajectory_to_row
    from echo_trl.train.offline.collator import TRAIN_INDEX

    tok = tiny_tokenizer("qwen3")
    n_action = sum(tokenize_with_roles(tok, traj()).action_mask)
    values = [-0.5] * n_action
    values[2] = bad
    with pytest.raises(DatasetSchemaError, match=rf"^trajectory 'g': behavior_logprobs\[2\]: {re.escape(problem)}"):
        trajectory_features(tok, traj(behavior=values), CollatorSettings())
    row = {**trajectory_to_row(traj(behavior=values)), TRAIN_INDEX: 7}
    with pytest.raises(DatasetSchemaError, match=r"^train_dataset row 7 \(group_id 'g'\): behavior_logprobs\[2\]: "):
        trajectory_features(tok, row, CollatorSettings())
