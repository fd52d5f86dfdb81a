"""The SFT stage's pure pieces: role weights, the weighted CE and its window divisor, collation, reward filtering."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from echo_trl.errors import EchoTrlError
from echo_trl.train.sft_collator import SFTExample, collate_sft, trains_actions
from echo_trl.train.sft_data import filter_by_reward
from echo_trl.train.sft_loss import WEIGHTS, role_weights, weighted_ce, window_weight_sum


def test_role_weights_follow_the_masks_and_the_action_gate():
    action = np.array([0, 1, 1, 0, 0, 1], dtype=bool)
    world = np.array([0, 0, 0, 1, 1, 0], dtype=bool)
    w = role_weights(action, world, action_weight=2.0, world_model_coeff=0.5)
    assert w.tolist() == [0, 2, 2, 0.5, 0.5, 2]
    gated = role_weights(action, world, action_weight=2.0, world_model_coeff=0.5, train_actions=False)
    assert gated.tolist() == [0, 0, 0, 0.5, 0.5, 0]
    with pytest.raises(ValueError, match="overlap"):
        role_weights(action, action, action_weight=1, world_model_coeff=1)


def _reference(logps: torch.Tensor, weights: torch.Tensor) -> float:
    """Plain Python loops, float64: sum over tokens 1.. of w * -logp / sum of w."""
    num = den = 0.0
    for b in range(weights.shape[0]):
        for t in range(1, weights.shape[1]):
            w = float(weights[b, t])
            num += w * -float(logps[b, t - 1])
            den += w
    return num / den


def test_weighted_ce_is_the_weighted_mean_of_the_shifted_tokens():
    g = torch.Generator().manual_seed(0)
    logps = -torch.rand(3, 6, generator=g) * 5
    weights = torch.tensor([[0, 1, 1, 0.3, 0.3, 0, 0], [0, 0, 2, 2, 0, 0, 0], [0, 1, 0, 0, 0, 0.3, 1]])
    out = weighted_ce(logps, weights)
    assert out.loss.item() == pytest.approx(_reference(logps, weights), rel=1e-6)
    assert out.weight_sum.item() == pytest.approx(float(weights[:, 1:].sum()))


def test_unit_weights_give_trls_token_mean():
    logps = -torch.arange(1.0, 9.0).reshape(2, 4)
    weights = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
    # TRL: sum of -logp over labelled tokens / their number; tokens 1,2 of row 0 and 2,3,4 of row 1
    expected = (1 + 2 + 6 + 7 + 8) / 5
    assert weighted_ce(logps, weights).loss.item() == pytest.approx(expected)


def test_micro_batches_over_the_window_divisor_sum_to_the_whole_batch_loss():
    """Gradient accumulation: each micro-batch divided by the window's weight sum adds up to the big batch's loss;
    with the divisor gathered over P processes and scaled by P, DDP's average gives the same."""
    g = torch.Generator().manual_seed(1)
    logps = -torch.rand(4, 7, generator=g)
    weights = torch.rand(4, 8, generator=g) * (torch.rand(4, 8, generator=g) > 0.4)
    whole = weighted_ce(logps, weights).loss
    parts = [{WEIGHTS: weights[:2]}, {WEIGHTS: weights[2:]}]
    divisor = window_weight_sum(parts)
    micro = [weighted_ce(logps[i : i + 2], weights[i : i + 2], divisor=divisor) for i in (0, 2)]
    assert sum(m.loss for m in micro).item() == pytest.approx(whole.item(), rel=1e-6)
    ddp = [weighted_ce(logps[i : i + 2], weights[i : i + 2], divisor=divisor, scale=2).loss for i in (0, 2)]
    assert (sum(ddp) / 2).item() == pytest.approx(whole.item(), rel=1e-6)


def test_no_weighted_token_gives_a_connected_zero():
    logps = torch.zeros(1, 3, requires_grad=True)
    out = weighted_ce(logps, torch.zeros(1, 4), divisor=0.0)
    assert out.loss.item() == 0.0 and out.loss.requires_grad
    out.loss.backward()
    assert torch.isfinite(logps.grad).all()


def test_collate_pads_right_and_labels_only_weighted_tokens():
    a = SFTExample([5, 6, 7], np.array([0, 1, 0.5], np.float32), np.array([0, 1, 0], bool), np.array([0, 0, 1], bool))
    b = SFTExample([8, 9], np.array([0, 0], np.float32), np.array([0, 0], bool), np.array([0, 0], bool))
    out = collate_sft([a, b], pad_token_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["labels"].tolist() == [[-100, 6, 7], [-100, -100, -100]]
    assert out[WEIGHTS].tolist() == [[0, 1, 0.5], [0, 0, 0]]


def test_trains_actions():
    assert trains_actions(None, None) and trains_actions(-1.0, None)
    assert trains_actions(1.0, 1.0) and not trains_actions(0.1, 1.0) and not trains_actions(None, 0.0)


def _rewards(values):
    from datasets import Dataset

    return Dataset.from_dict({"reward": values, "i": list(range(len(values)))})


def test_min_reward_keeps_the_rows_at_or_above_it():
    ds = _rewards([1.0, 0.1, -1.0, None, 1.0, 0.5])
    kept, report = filter_by_reward(ds, 0.5)
    assert kept["i"] == [0, 4, 5]
    assert (report.total, report.kept, report.dropped) == (6, 3, 3)
    assert "keeps 3 of 6" in report.summary() and "\n" not in report.summary()
    every, report = filter_by_reward(ds, 0.5, world_all_episodes=True)
    assert every["i"] == list(range(6)) and report.kept == 3 and "--world_all_episodes" in report.summary()
    same, report = filter_by_reward(ds, None)
    assert len(same) == 6 and report.dropped == 0


def test_min_reward_refuses_when_nothing_or_no_reward_is_left():
    with pytest.raises(EchoTrlError, match="no episode has reward >= 2"):
        filter_by_reward(_rewards([1.0, 0.1]), 2.0)
    from datasets import Dataset

    with pytest.raises(EchoTrlError, match="'reward' column"):
        filter_by_reward(Dataset.from_dict({"x": [1]}), 0.0)
