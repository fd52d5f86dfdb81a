"""behavior_policy: the starting model's log-probs as the behaviour policy of rows recorded without any.

Checked against an independent forward (the model's own head, full logits): the stored values are the
starting model's; with them the importance ratio departs from 1 as training moves and clipping engages,
where "current" keeps it at 1; recorded behavior_logprobs win; computed once per (dataset, weights,
settings) and loaded from the cache after that.
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import pytest
import torch
from helpers.arrow_edit import redact_in_place
from helpers.tiny import tiny_model
from helpers.trainer import batch, count_forwards, dataset, make_trainer, reference_logps, tiny_config, trajectory

from echo_trl.config import EchoConfigError
from echo_trl.data.build import trajectories_to_dataset
from echo_trl.errors import EchoTrlError
from echo_trl.roles import Role
from echo_trl.tokens.cache import IDS, ROLES
from echo_trl.train.offline import behavior
from echo_trl.train.offline.behavior import CHECKPOINT_FILE, TRAIN_INDEX, model_fingerprint
from echo_trl.train.offline.collator import STARTING_LOGPS

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def action_of(inputs) -> torch.Tensor:
    return inputs["tool_mask"].bool() & inputs["completion_mask"].bool()


@pytest.mark.parametrize("share, temperature", [(True, 1.0), (False, 1.0), (True, 0.7)])
def test_starting_logps_are_the_starting_models_own(tmp_path, share, temperature):
    trainer = make_trainer(
        tmp_path / "run", dataset(4), behavior_policy="initial", prefix_sharing=share, temperature=temperature
    )
    assert STARTING_LOGPS in trainer.train_dataset.column_names
    inputs = batch(trainer)
    action = action_of(inputs)
    with torch.no_grad():
        expected = reference_logps(trainer.model, inputs, temperature)  # nothing trained yet: the starting model
    old = inputs["old_per_token_logps"]
    assert action.sum() > 20
    torch.testing.assert_close(old[action], expected[action], atol=1e-5, rtol=0)
    assert torch.isnan(old[~action]).all()  # env outputs, padding: no behaviour log-prob


def test_initial_ratio_departs_and_clipping_engages_where_current_stays_at_one(tmp_path):
    runs = {}
    for policy in ("initial", "current"):
        trainer = make_trainer(
            tmp_path / policy,
            dataset(8),
            behavior_policy=policy,
            max_steps=10,
            learning_rate=5e-2,
            world_model_coeff=0.0,
        )
        trainer.train()
        clip = [h["clip_ratio/region_mean"] for h in trainer.state.log_history if "clip_ratio/region_mean" in h]
        inputs = batch(trainer)
        with torch.no_grad():
            now = reference_logps(trainer.model, inputs)
        runs[policy] = clip, inputs, now
    clip, inputs, now = runs["initial"]
    action = action_of(inputs)
    ratio = torch.exp(now[action] - inputs["old_per_token_logps"][action])
    assert (ratio - 1).abs().max() > 0.2  # beyond TRL's epsilon: the starting model is 10 updates away
    assert clip[0] == 0 and max(clip) > 0  # the first update is on-policy; later ones clip
    clip, inputs, _ = runs["current"]
    assert "old_per_token_logps" not in inputs  # TRL then divides by the policy's own detached log-probs
    assert len(clip) == 10 and all(c == 0 for c in clip)


def test_recorded_behavior_logprobs_win_and_only_the_other_rows_are_forwarded(tmp_path):
    probe = make_trainer(tmp_path / "probe", dataset(4), behavior_policy="current")
    n_action = [sum(r == Role.ACTION.code for r in roles) for roles in probe.train_dataset[ROLES]]
    recorded = {0: [-1.0 - k / 100 for k in range(n_action[0])], 1: [-2.0] * n_action[1]}
    rows = [
        trajectory(i, [1.0, 0.0, 0.5, 0.1][i], f"g{i // 2}", warning=(i == 1), behavior=recorded.get(i))
        for i in range(4)
    ]
    model = tiny_model()
    calls, handle = count_forwards(model)
    trainer = make_trainer(tmp_path / "mixed", trajectories_to_dataset(rows), model=model, behavior_policy="initial")
    handle.remove()
    assert calls == [False]  # one no-grad forward: rows 2 and 3 in one micro-batch
    column = trainer.train_dataset[STARTING_LOGPS]
    assert column[0] is None and column[1] is None and len(column[2]) == n_action[2] and len(column[3]) == n_action[3]
    inputs = batch(trainer)
    action = action_of(inputs)
    old = inputs["old_per_token_logps"]
    for i in (0, 1):
        assert old[i][action[i]].tolist() == pytest.approx(recorded[i], abs=1e-6)
    with torch.no_grad():
        expected = reference_logps(trainer.model, inputs)
    for i in (2, 3):
        torch.testing.assert_close(old[i][action[i]], expected[i][action[i]], atol=1e-5, rtol=0)

    everything = [trajectory(i, [1.0, 0.0][i], "g0", behavior=recorded[i]) for i in range(2)]
    calls, handle = count_forwards(model)
    full = make_trainer(
        tmp_path / "full",
        trajectories_to_dataset(everything),
        model=model,
        behavior_policy="initial",
        per_device_train_batch_size=2,
    )
    handle.remove()
    assert calls == [] and STARTING_LOGPS not in full.train_dataset.column_names


def test_computed_once_per_dataset_weights_and_settings(tmp_path):
    ds = dataset(4)
    runs = []
    for name, seed, kw in (
        ("a", 0, {}),
        ("again", 0, {}),
        ("other_weights", 1, {}),
        ("other_truncation", 0, {"max_completion_length": 60}),
    ):
        model = tiny_model(seed)
        calls, handle = count_forwards(model)
        trainer = make_trainer(tmp_path / name, ds, model=model, behavior_policy="initial", **kw)
        handle.remove()
        runs.append((len(calls), trainer.train_dataset[STARTING_LOGPS]))
    (first, a), (again, b), (other, c), (cut, d) = runs
    assert first == 1 and again == 0 and b == a  # the second run loads the cached column, same values
    assert other == 1 and c != a  # other starting weights: computed again
    assert cut == 1 and all(len(x) <= len(y) for x, y in zip(d, a, strict=True)) and d != a
    assert len(list(Path(os.environ["ECHO_TRL_CACHE"]).rglob("echo-initial-logps-*.arrow"))) == 3


def test_recomputed_values_equal_the_cached_ones_bit_for_bit(tmp_path, monkeypatch):
    """What a resumed run on another machine (no cache) gets: the same numbers."""
    ds = dataset(4)
    first = make_trainer(tmp_path / "a", ds, behavior_policy="initial").train_dataset[STARTING_LOGPS]
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path / "other_cache"))
    again = make_trainer(tmp_path / "b", ds, behavior_policy="initial").train_dataset[STARTING_LOGPS]
    assert again == first


def test_model_fingerprint_follows_the_weights():
    model = tiny_model()
    before = model_fingerprint(model)
    assert model_fingerprint(tiny_model()) == before
    with torch.no_grad():
        weight = model.model.layers[0].mlp.up_proj.weight
        weight.view(-1)[1] += 1e-3  # one value, between the sampled ones: the sums still see it
    assert model_fingerprint(model) != before


def test_sharded_weights_defer_initial_to_the_first_batch(tmp_path, monkeypatch):
    """ZeRO-3 / FSDP: nothing can be forwarded at init; the first training batch gets the starting model's values
    (here one process stands in for the engine, whose collective forward tests/test_deepspeed.py runs)."""
    monkeypatch.setattr(behavior, "weights_are_sharded", lambda trainer: True)
    trainer = make_trainer(tmp_path / "a", dataset(4), behavior_policy="initial")
    assert STARTING_LOGPS not in trainer.train_dataset.column_names
    assert trainer.train_dataset[TRAIN_INDEX] == [0, 1, 2, 3]
    inputs = batch(trainer)
    action = action_of(inputs)
    with torch.no_grad():
        expected = reference_logps(trainer.model, inputs)
    torch.testing.assert_close(inputs["old_per_token_logps"][action], expected[action], atol=1e-5, rtol=0)
    current = make_trainer(tmp_path / "b", dataset(4), behavior_policy="current")
    assert STARTING_LOGPS not in current.train_dataset.column_names and "old_per_token_logps" not in batch(current)


def test_sharded_initial_travels_with_checkpoints_and_is_never_recomputed(tmp_path, monkeypatch):
    monkeypatch.setattr(behavior, "weights_are_sharded", lambda trainer: True)
    calls = []
    compute = behavior.starting_logps
    monkeypatch.setattr(behavior, "starting_logps", lambda *a, **kw: calls.append(1) or compute(*a, **kw))
    kw = dict(behavior_policy="initial", max_steps=2, save_strategy="steps", save_steps=1, learning_rate=5e-2)
    first = make_trainer(tmp_path / "run", dataset(4), **kw)
    first.train()
    assert len(calls) == 1  # once, at the first batch
    saved = torch.load(tmp_path / "run" / "checkpoint-1" / CHECKPOINT_FILE, weights_only=True)["values"]
    assert saved == first._echo_starting_logps.values and sorted(saved) == [0, 1, 2, 3]
    resumed = make_trainer(tmp_path / "run", dataset(4), **{**kw, "max_steps": 2})
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    assert len(calls) == 1 and resumed._echo_starting_logps.values == saved  # from the checkpoint, not trained weights
    os.remove(tmp_path / "run" / "checkpoint-1" / CHECKPOINT_FILE)
    lost = make_trainer(tmp_path / "run", dataset(4), **kw)
    with pytest.raises(EchoTrlError, match="cannot be recomputed from trained weights"):
        lost.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-1"))
    assert len(calls) == 1


def test_verifier_free_and_online_runs_compute_nothing(tmp_path):
    model = tiny_model()
    calls, handle = count_forwards(model)
    trainer = make_trainer(tmp_path, dataset(4), model=model, behavior_policy="initial", use_policy_loss=False)
    handle.remove()
    assert calls == [] and STARTING_LOGPS not in trainer.train_dataset.column_names


def test_config_rejects_unknown_policies(tmp_path):
    with pytest.raises(EchoConfigError, match="behavior_policy must be one of initial, current"):
        tiny_config(tmp_path, behavior_policy="recorded")
    assert tiny_config(tmp_path).behavior_policy == "initial"  # the measured default


def test_a_stale_column_is_never_used(tmp_path):
    """A dataset saved from another run's trainer carries the column: "current" drops it, "initial" recomputes."""
    stale = make_trainer(tmp_path / "a", dataset(4), behavior_policy="initial").train_dataset
    stale = stale.map(lambda row: {STARTING_LOGPS: [v - 1.0 for v in row[STARTING_LOGPS]]})
    current = make_trainer(tmp_path / "b", stale, behavior_policy="current")
    assert STARTING_LOGPS not in current.train_dataset.column_names
    assert "old_per_token_logps" not in batch(current)
    initial = make_trainer(tmp_path / "c", stale, behavior_policy="initial")
    inputs = batch(initial)
    action = action_of(inputs)
    with torch.no_grad():
        expected = reference_logps(initial.model, inputs)
    torch.testing.assert_close(inputs["old_per_token_logps"][action], expected[action], atol=1e-5, rtol=0)


def test_unrecorded_rows_follow_the_dataset_view():
    from echo_trl.train.offline.behavior import unrecorded_rows

    ds = trajectories_to_dataset([trajectory(i, 1.0, "g", behavior=[0.1] * 3 if i % 2 else None) for i in range(6)])
    assert unrecorded_rows(ds) == [0, 2, 4]
    assert unrecorded_rows(ds.select([5, 4, 1, 0])) == [1, 3]  # positions in the selection, not the table
    assert unrecorded_rows(ds.remove_columns("behavior_logprobs")) == list(range(6))


def test_an_arrow_file_edited_in_place_is_trained_on(tmp_path):
    """A tool output edited in the saved Arrow file (``state.json`` untouched, size and mtime kept): the
    trainer's tokens and starting-model log-probs are those of the new text, as computed from scratch on an
    in-memory copy of the edited rows, not the ones cached from the old text."""
    dataset(4).save_to_disk(str(tmp_path / "ds"))
    old = make_trainer(tmp_path / "old", datasets.load_from_disk(str(tmp_path / "ds")), behavior_policy="initial")
    assert redact_in_place(tmp_path / "ds", '"total": 2}', '"total": 9}') == 1  # row 1's first tool output
    edited = datasets.load_from_disk(str(tmp_path / "ds"))
    trained = make_trainer(tmp_path / "new", edited, behavior_policy="initial").train_dataset
    copy = datasets.Dataset.from_list(list(edited), features=edited.features)
    fresh = make_trainer(tmp_path / "fresh", copy, behavior_policy="initial").train_dataset
    assert trained[IDS] == fresh[IDS] and trained[STARTING_LOGPS] == fresh[STARTING_LOGPS]
    assert trained[1][IDS] != old.train_dataset[1][IDS]
    assert trained[1][STARTING_LOGPS] != old.train_dataset[1][STARTING_LOGPS]
