"""No non-finite update is applied and no non-finite weights are saved (echo_trl.train.step.finite).

The corruptions here are injected *past* the input checks (the collated batch, the forward, the learning rate),
as a bug or an overflow would, to show the last lines hold: the run stops with one line naming the optimizer
step, the rows and the field, the weights are those of the last good step, and nothing non-finite is on disk.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from helpers.trainer import batch, make_trainer
from safetensors.torch import load_file

from echo_trl.errors import EchoTrlError
from echo_trl.train import trl_compat
from echo_trl.train.offline import recorded as offline
from echo_trl.train.offline.collator import TRAIN_INDEX
from echo_trl.train.step.finite import non_finite, require_finite_weights

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

# helpers.trainer.dataset(4): rewards 1.0, 0.0 (group g0) and 0.5, 0.1 (group g1), so rows 0 and 2 have a
# positive advantage, rows 1 and 3 a negative one; one batch of 4 rows per optimizer step.


def corrupt_old_logps(monkeypatch, trainer, rows, *, at_step: int = 0, first_token_only: bool = False):
    """Collated batches of optimizer step ``at_step`` (0-based) get a behaviour log-prob of -1e30 at the action
    tokens of ``rows``: what a recorded -1e30 did before it was refused at the door."""
    collate = offline.collate_batch

    def bad_collate(trainer_, rows_, settings):
        out = collate(trainer_, rows_, settings)
        if trainer_.model.training and trainer_.state.global_step == at_step:
            action = (out["tool_mask"] * out["completion_mask"]).bool()
            old = out.get("old_per_token_logps")
            old = torch.full(action.shape, float("nan")) if old is None else old.clone()
            for r in rows:  # the batch is in the sampler's (prefix-grouped) order: find the dataset row
                at = out[TRAIN_INDEX].tolist().index(r)
                cols = action[at].nonzero().flatten()
                old[at, cols[:1] if first_token_only else cols] = -1e30
            out["old_per_token_logps"] = old
        return out

    monkeypatch.setattr(offline, "collate_batch", bad_collate)


def state(trainer):
    return copy.deepcopy(trainer.model.state_dict())


def assert_unchanged(trainer, before):
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_non_finite_gradient_with_a_finite_loss_stops_before_the_update_and_saves_nothing(tmp_path, monkeypatch):
    """The issue's case: -1e30 at one action token of a positive-advantage row. The loss stays finite (the clipped
    branch is taken) while the gradient is NaN (0 x exp overflow); unguarded, one step made every weight NaN and a
    --save_steps 1 checkpoint saved them."""
    out = tmp_path / "run"
    trainer = make_trainer(out, shuffle_dataset=False, save_strategy="steps", save_steps=1, behavior_policy="current")
    corrupt_old_logps(monkeypatch, trainer, rows=[0], first_token_only=True)
    before = state(trainer)
    with pytest.raises(EchoTrlError) as err:
        trainer.train()
    message = str(err.value)
    assert message.startswith("optimizer step 1: non-finite gradient of the loss (GRPO + world term) in "), message
    assert "from rows 0, 1, 2, 3 of train_dataset; every loss term was finite" in message
    assert "largest importance log-ratio is 1e+30" in message and "field old_per_token_logps" in message
    assert "\n" not in message
    assert_unchanged(trainer, before)
    assert not list(out.glob("checkpoint-*")) and not list(out.glob("*.safetensors"))


def test_a_non_finite_grpo_term_stops_before_backward_naming_the_field(tmp_path, monkeypatch):
    """-1e30 at every action token of a negative-advantage row: exp overflows to inf in the unclipped branch."""
    trainer = make_trainer(tmp_path, shuffle_dataset=False, behavior_policy="current")
    corrupt_old_logps(monkeypatch, trainer, rows=[1])
    before = state(trainer)
    with pytest.raises(EchoTrlError) as err:
        trainer.train()
    assert str(err.value).startswith(
        "optimizer step 1: the GRPO loss is inf (rows 0, 1, 2, 3 of train_dataset; field old_per_token_logps "
        "(the rows' behavior_logprobs, or the starting model's): -1e+30 at an action token)"
    ), str(err.value)
    assert_unchanged(trainer, before)


def test_the_grpo_term_is_checked_at_lambda_zero_too(tmp_path, monkeypatch):
    """λ = 0 returns TRL's loss bit for bit; it used to return it unchecked."""
    trainer = make_trainer(tmp_path, world_model_coeff=0.0, shuffle_dataset=False)
    row, col = (batch(trainer)["tool_mask"] * batch(trainer)["completion_mask"]).nonzero()[0].tolist()
    forward = trl_compat.shared_forward

    def with_nan(*args, **kwargs):
        shared = forward(*args, **kwargs)
        logps = shared.logps.clone()
        logps[row, col] = float("nan")
        return dataclasses.replace(shared, logps=logps)

    monkeypatch.setattr(trl_compat, "shared_forward", with_nan)
    before = state(trainer)
    with pytest.raises(EchoTrlError, match=r"^optimizer step 1: the GRPO loss is nan \(rows 0, 1, 2, 3 of "):
        trainer.train()
    assert_unchanged(trainer, before)


def test_with_save_steps_1_no_checkpoint_ever_holds_non_finite_weights(tmp_path, monkeypatch):
    """Step 1 is good and checkpointed; step 2 is corrupted: the run stops before step 2's update, and the only
    checkpoint on disk is step 1's, every tensor finite and equal to the weights in memory."""
    out = tmp_path / "run"
    trainer = make_trainer(
        out, shuffle_dataset=False, save_strategy="steps", save_steps=1, max_steps=2, behavior_policy="current"
    )
    corrupt_old_logps(monkeypatch, trainer, rows=[0], at_step=1, first_token_only=True)
    with pytest.raises(EchoTrlError, match=r"^optimizer step 2: non-finite gradient"):
        trainer.train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    saved = load_file(out / "checkpoint-1" / "model.safetensors")
    assert saved and all(torch.isfinite(t).all() for t in saved.values())
    in_memory = trainer.model.state_dict()
    for name, value in saved.items():
        assert torch.equal(value, in_memory[name]), name  # step 2 was never applied


def test_an_update_that_makes_weights_non_finite_stops_before_its_checkpoint(tmp_path):
    """Finite gradients, an absurd learning rate: AdamW moves every weight by ~lr = 1e39 > float32's max."""
    out = tmp_path / "run"
    trainer = make_trainer(out, learning_rate=1e39, save_strategy="steps", save_steps=1)
    with pytest.raises(EchoTrlError, match=r"^optimizer step 1: the update made \d+ weight tensor\(s\) non-finite"):
        trainer.train()
    assert non_finite(trainer.model.named_parameters())  # the premise: the update did overflow
    assert not list(out.glob("checkpoint-*"))


def test_save_model_refuses_non_finite_weights(tmp_path):
    trainer = make_trainer(tmp_path / "run")
    with torch.no_grad():
        next(trainer.model.parameters())[0, 0] = float("nan")
    with pytest.raises(EchoTrlError, match=r"refusing to save .*out: 1 weight tensor\(s\) hold NaN or infinity"):
        trainer.save_model(str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    with pytest.raises(EchoTrlError, match="refusing to save"):
        require_finite_weights(trainer.model, "x")


def test_non_finite_names_exactly_the_tensors_that_hold_nan_or_inf():
    named = [
        ("a", torch.zeros(3)),
        ("b", torch.tensor([1.0, float("inf")])),
        ("c", None),
        ("d", torch.tensor([float("nan")])),
    ]
    assert non_finite(named) == ["b", "d"]
    assert non_finite([("a", torch.ones(2))]) == [] and non_finite([]) == []
