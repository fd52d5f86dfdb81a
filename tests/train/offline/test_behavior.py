"""behavior_policy: the starting model's log-probs as the behaviour policy of rows recorded without any.

Checked against an independent forward (the model's own head, full logits): the stored values are the
starting model's; with them the importance ratio departs from 1 as training moves and clipping engages,
where "current" keeps it at 1; recorded behavior_logprobs win; nothing is forwarded at init: each row is
computed when training first uses it (from the starting model even after updates), equals the whole-dataset
column computed before (and trains the same), and is kept in a store under output_dir that resumes and later
runs with the same (dataset, weights, settings) read instead of forwarding again.
"""

from __future__ import annotations

import os

import datasets
import numpy as np
import pytest
import torch
from helpers.arrow_edit import redact_in_place
from helpers.tiny import tiny_model
from helpers.trainer import (
    assert_same_gradient,
    batch,
    count_forwards,
    dataset,
    make_trainer,
    reference_logps,
    tiny_config,
    trajectory,
)

from echo_trl.config import EchoConfigError
from echo_trl.data.build import trajectories_to_dataset
from echo_trl.errors import EchoTrlError
from echo_trl.roles import Role
from echo_trl.tokens.cache import IDS, ROLES
from echo_trl.train.offline import behavior
from echo_trl.train.offline.behavior import CHECKPOINT_FILE, TRAIN_INDEX, model_fingerprint
from echo_trl.train.offline.collator import STARTING_LOGPS
from echo_trl.train.offline.starting_store import StartingStore

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def action_of(inputs) -> torch.Tensor:
    return inputs["tool_mask"].bool() & inputs["completion_mask"].bool()


@pytest.mark.parametrize("share, temperature", [(True, 1.0), (False, 1.0), (True, 0.7)])
def test_starting_logps_are_the_starting_models_own(tmp_path, share, temperature):
    trainer = make_trainer(
        tmp_path / "run", dataset(4), behavior_policy="initial", prefix_sharing=share, temperature=temperature
    )
    assert STARTING_LOGPS not in trainer.train_dataset.column_names  # nothing forwarded at init
    assert trainer._echo_starting_logps.computed == 0
    inputs = batch(trainer)
    assert trainer._echo_starting_logps.computed == 4
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
    assert calls == [] and trainer._echo_starting_logps.todo == {2, 3}  # nothing at init; rows 2 and 3 to compute
    inputs = batch(trainer)
    action = action_of(inputs)
    old = inputs["old_per_token_logps"]
    for i in (0, 1):
        assert old[i][action[i]].tolist() == pytest.approx(recorded[i], abs=1e-6)
    with torch.no_grad():
        expected = reference_logps(trainer.model, inputs)
    for i in (2, 3):
        torch.testing.assert_close(old[i][action[i]], expected[i][action[i]], atol=1e-5, rtol=0)
    assert trainer._echo_starting_logps.computed == 2  # only the rows without recorded log-probs were forwarded

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
    assert "old_per_token_logps" in batch(full) and not (tmp_path / "full" / behavior.STORE_DIR).exists()


def test_computed_once_per_dataset_weights_and_settings(tmp_path):
    """Runs in one output_dir: the second with the same starting weights and settings forwards nothing and gets the
    same values; other weights or another truncation get their own store and compute again."""
    ds = dataset(4)
    runs = []
    for seed, kw in ((0, {}), (0, {}), (1, {}), (0, {"max_completion_length": 60})):
        trainer = make_trainer(tmp_path / "run", ds, model=tiny_model(seed), behavior_policy="initial", **kw)
        inputs = batch(trainer)
        action = action_of(inputs)
        runs.append(
            (trainer._echo_starting_logps.computed, [inputs["old_per_token_logps"][i][action[i]] for i in range(4)])
        )
    (first, a), (again, b), (other, c), (cut, d) = runs
    assert first == 4 and again == 0 and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert other == 4 and not torch.equal(c[0], a[0])  # other starting weights: computed again
    assert cut == 4 and all(len(x) <= len(y) for x, y in zip(d, a, strict=True))
    assert len(list((tmp_path / "run" / behavior.STORE_DIR).iterdir())) == 3


def test_recomputed_values_equal_the_stored_ones_bit_for_bit(tmp_path):
    """What a resumed run on another machine (no store) gets: the same numbers."""
    ds = dataset(4)
    first = batch(make_trainer(tmp_path / "a", ds, behavior_policy="initial"))["old_per_token_logps"]
    stored = batch(make_trainer(tmp_path / "a", ds, behavior_policy="initial"))["old_per_token_logps"]
    again = batch(make_trainer(tmp_path / "b", ds, behavior_policy="initial"))["old_per_token_logps"]
    assert torch.equal(first.nan_to_num(), stored.nan_to_num()) and torch.equal(first.nan_to_num(), again.nan_to_num())


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
    """A dataset saved from an earlier version's trainer carries the column: "current" drops it, "initial"
    recomputes."""
    ds = dataset(4)
    stale = ds.add_column(STARTING_LOGPS, [[-9.0] * 40] * len(ds))
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
    in-memory copy of the edited rows, not the ones stored for the old text in the same output_dir."""
    dataset(4).save_to_disk(str(tmp_path / "ds"))
    old = make_trainer(tmp_path / "run", datasets.load_from_disk(str(tmp_path / "ds")), behavior_policy="initial")
    old_logps = batch(old)["old_per_token_logps"]
    assert redact_in_place(tmp_path / "ds", '"total": 2}', '"total": 9}') == 1  # row 1's first tool output
    edited = datasets.load_from_disk(str(tmp_path / "ds"))
    trainer = make_trainer(tmp_path / "run", edited, behavior_policy="initial")
    trained, logps = trainer.train_dataset, batch(trainer)["old_per_token_logps"]
    assert trainer._echo_starting_logps.computed == 4  # a new fingerprint: nothing read from the old text's store
    copy = datasets.Dataset.from_list(list(edited), features=edited.features)
    fresh = make_trainer(tmp_path / "fresh", copy, behavior_policy="initial")
    assert trained[IDS] == fresh.train_dataset[IDS]
    assert torch.equal(logps.nan_to_num(), batch(fresh)["old_per_token_logps"].nan_to_num())
    assert trained[1][IDS] != old.train_dataset[1][IDS]
    assert not torch.equal(logps[1].nan_to_num(), old_logps[1].nan_to_num())


def test_rows_first_used_after_updates_get_the_starting_models_values(tmp_path):
    """The trainer's model has moved by the time a row is first used: its values come from the frozen starting
    model (here: a fresh copy of the same initial weights), not from the trained one."""
    trainer = make_trainer(tmp_path / "run", dataset(4), behavior_policy="initial", max_steps=3, learning_rate=5e-2)
    trainer.train()
    trainer._echo_starting_logps.store = StartingStore(tmp_path / "empty")  # every row forwarded again
    inputs = batch(trainer)
    action = action_of(inputs)
    with torch.no_grad():
        start = reference_logps(tiny_model(), inputs)
        now = reference_logps(trainer.model, inputs)
    assert (now[action] - start[action]).abs().max() > 1e-2  # the trained model is elsewhere
    torch.testing.assert_close(inputs["old_per_token_logps"][action], start[action], atol=1e-5, rtol=0)


@pytest.mark.parametrize("share", [True, False])
def test_lazy_values_equal_the_whole_dataset_column(tmp_path, share):
    """Each row's lazily computed values against today's whole-dataset pass (:func:`behavior.starting_logps`, the
    column computed before step 1 until now) on the same rows: float32 both, equal to float32 rounding (the two
    collate a row with other rows, so padding and the summation order of the batched matmuls differ; a wrong
    row or position misses by far more than 1e-5)."""
    trainer = make_trainer(
        tmp_path / "run", dataset(8), behavior_policy="initial", prefix_sharing=share, per_device_train_batch_size=2
    )
    lazy = trainer._echo_starting_logps
    rows = list(trainer.train_dataset)
    eager = behavior.starting_logps(trainer, trainer.train_dataset, sorted(lazy.todo), lazy.settings, share=share)
    for k in (0, 4, 2, 6):  # the lazy path in another composition than the eager micro-batches
        lazy.rows(trainer, [rows[k], rows[k + 1]])
    assert lazy.computed == 8
    for i in range(8):
        got = lazy.store.get(i)
        assert len(got) == len(eager[i]) > 5
        np.testing.assert_allclose(np.float32(got), np.float32(eager[i]), atol=1e-5, rtol=0)


def test_training_with_lazy_values_equals_training_with_the_whole_dataset_column(tmp_path, monkeypatch):
    """Three steps with the default (lazy) against three with the column computed for the whole dataset before
    the first update (the deferred whole-dataset pass, which the code took before at init): same losses, same
    weights (up to float32 summation order)."""
    kw = dict(behavior_policy="initial", max_steps=3, learning_rate=5e-2, per_device_train_batch_size=2)
    lazy = make_trainer(tmp_path / "lazy", dataset(8), **kw)
    lazy.train()
    monkeypatch.setattr(behavior, "weights_are_sharded", lambda trainer: True)
    eager = make_trainer(tmp_path / "eager", dataset(8), **kw)
    eager.train()
    assert isinstance(lazy._echo_starting_logps, behavior.LazyStartingLogps)
    assert sorted(eager._echo_starting_logps.values) == list(range(8))  # the whole column at the first batch
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (lazy, eager)]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], abs=1e-5)
    clip = [h["clip_ratio/region_mean"] for h in lazy.state.log_history if "clip_ratio/region_mean" in h]
    assert max(clip) > 0  # the starting-model ratio binds: the values matter to the result
    for (name, a), b in zip(lazy.model.named_parameters(), eager.model.parameters(), strict=True):
        assert_same_gradient(a.detach(), b.detach(), name)


def test_a_resumed_run_recomputes_no_row_it_saw_and_ends_where_the_uninterrupted_one_does(tmp_path):
    """Stopped after step 2 (of 4, epochs of 2 steps), resumed from checkpoint-2: the rows of steps 1-2 come from
    the store (no forward; steps 3-4 revisit them), and the weights equal the uninterrupted run's."""
    from transformers import TrainerCallback

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    kw = dict(
        behavior_policy="initial",
        max_steps=4,
        learning_rate=5e-2,
        lr_scheduler_type="constant",
        save_strategy="steps",
        save_steps=2,
    )
    full = make_trainer(tmp_path / "full", dataset(4), **{**kw, "per_device_train_batch_size": 2})
    full.train()
    assert full._echo_starting_logps.computed == 4
    stopped = make_trainer(tmp_path / "run", dataset(4), **{**kw, "per_device_train_batch_size": 2})
    stopped.add_callback(StopAt())
    stopped.train()
    assert stopped.state.global_step == 2 and stopped._echo_starting_logps.computed == 4
    resumed = make_trainer(tmp_path / "run", dataset(4), **{**kw, "per_device_train_batch_size": 2})
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert resumed.state.global_step == 4 and resumed._echo_starting_logps.computed == 0
    for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_resume_elsewhere_reads_the_store_beside_the_checkpoint(tmp_path):
    kw = dict(behavior_policy="initial", max_steps=2, save_strategy="steps", save_steps=2)
    make_trainer(tmp_path / "run", dataset(4), **kw).train()
    moved = make_trainer(tmp_path / "other", dataset(4), **{**kw, "max_steps": 3})
    moved.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    assert moved.state.global_step == 3 and moved._echo_starting_logps.computed == 0


def test_store_keeps_complete_records_and_overwrites_a_torn_one(tmp_path):
    """A kill in the middle of an append: the complete records stay readable, the cut one is dropped and the next
    append writes over it."""
    store = StartingStore(tmp_path, rank=0)
    store.append({3: [-0.5, -1.25], 7: [-2.0]})
    store.append({1: [-0.125] * 5})
    path = tmp_path / "rank-0.bin"
    path.write_bytes(path.read_bytes()[:-6])  # the last record cut short
    reread = StartingStore(tmp_path, rank=0)
    assert sorted(reread.index) == [3, 7] and reread.get(3) == [-0.5, -1.25] and reread.get(7) == [-2.0]
    reread.append({1: [-0.25] * 2})
    other = StartingStore(tmp_path, rank=1)  # another process reads every process's records
    assert (
        sorted(other.index) == [1, 3, 7] and other.get(1) == [-0.25, -0.25] and 1 not in StartingStore(tmp_path / "x")
    )


def test_the_starting_model_is_the_reference_model_when_it_holds_the_same_weights(tmp_path):
    """beta > 0 with the policy loaded from a path: TRL loads its reference model from the same path, which is
    reused (no third model); with beta = 0 a frozen copy is made (no gradient, eval mode, not the trained model)."""
    from transformers import AutoModelForCausalLM

    tiny_model().save_pretrained(tmp_path / "model")
    load = lambda: AutoModelForCausalLM.from_pretrained(tmp_path / "model")  # noqa: E731
    kl = make_trainer(tmp_path / "kl", model=load(), beta=0.04, behavior_policy="initial")
    assert kl.ref_model is not None and kl._echo_starting_logps.source.model is kl.ref_model
    plain = make_trainer(tmp_path / "plain", model=load(), behavior_policy="initial")
    frozen = plain._echo_starting_logps.source.model
    assert frozen is not None and frozen is not plain.model and not frozen.training
    assert not any(p.requires_grad for p in frozen.parameters())
    assert model_fingerprint(frozen) == model_fingerprint(plain.model)
