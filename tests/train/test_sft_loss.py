"""The SFT stage's pure pieces: role weights coded into TRL's labels, the weighted loss and its window divisor,
reward filtering."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers.trainer_pt_utils import LabelSmoother

from echo_trl.errors import EchoTrlError
from echo_trl.roles import Role
from echo_trl.train.sft.loss import align_weights, weighted_label_smoothing, weighted_nll
from echo_trl.train.sft.reward_filter import filter_by_reward
from echo_trl.train.sft.weights import (
    ACTION,
    IGNORE_INDEX,
    OBSERVATION,
    PLAIN,
    SFTWeights,
    batch_weight_sum,
    class_weights,
    role_labels,
    split_labels,
    trains_actions,
)

C, A, E, W, OB = (r.code for r in (Role.CONTEXT, Role.ACTION, Role.ENV_OUTPUT, Role.WARNING, Role.OBSERVATION))


def _decoded(labels: list[int], weights: SFTWeights) -> tuple[list[int], list[float]]:
    split = split_labels(torch.tensor([labels]))
    if split is None:
        return labels, [0.0 if x == IGNORE_INDEX else 1.0 for x in labels]
    ids, classes = split
    return ids[0].tolist(), class_weights(classes, weights.table)[0].tolist()


def test_role_weights_override_trls_mask_on_observations_and_scale_it_on_actions():
    ids = [10, 11, 12, 13, 14, 15, 16, 17, 18]
    roles = [C, C, A, A, OB, E, E, W, A]
    trl = [-100, 11, 12, -100, 14, -100, 16, 17, 18]  # TRL's mask: 0 on 0, 3, 5
    weights = SFTWeights(action_weight=2.0, observation_weight=0.5)
    labels, w = _decoded(role_labels(ids, trl, roles, weights), weights)
    # context: TRL's mask; action: 2 x TRL's mask; observation wrapper: TRL's; env output: 0.5 always; warning: 0
    assert w == [0, 1, 2, 0, 1, 0.5, 0.5, 0, 2]
    assert labels == [IGNORE_INDEX if x == 0 else i for i, x in zip(ids, w, strict=True)]
    # an episode kept for its observations only trains nothing else
    _, gated = _decoded(role_labels(ids, trl, roles, weights, train_actions=False), weights)
    assert gated == [0, 0, 0, 0, 0, 0.5, 0.5, 0, 0]
    # world_loss_target="all" weighs the wrapper and the warning as observations
    wide = SFTWeights(observation_weight=0.5, world_loss_target="all")
    assert _decoded(role_labels(ids, trl, roles, wide), wide)[1] == [0, 1, 1, 0, 0.5, 0.5, 0.5, 0.5, 1]
    # at most one world token per observation (the first): the rest is not trained
    capped = SFTWeights(max_world_model_tokens=1)
    assert _decoded(role_labels(ids, trl, roles, capped), capped)[1] == [0, 1, 1, 0, 1, 1, 0, 0, 1]


def test_unit_weights_on_a_row_without_roles_are_trls_labels_unchanged():
    ids, trl = [5, 6, 7, 8], [-100, 6, 7, 8]
    labels = role_labels(ids, trl, [C, C, C, C], SFTWeights())
    assert labels == trl and split_labels(torch.tensor([labels])) is None


def test_split_labels_keeps_padding_and_reads_every_class():
    weights = SFTWeights(action_weight=3.0, observation_weight=0.25)
    row = role_labels([1, 2, 3, 4], [1, 2, 3, -100], [C, A, E, C], weights)
    padded = torch.tensor([row + [IGNORE_INDEX, IGNORE_INDEX]])
    ids, classes = split_labels(padded)
    assert ids.tolist() == [[1, 2, 3, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]
    assert classes.tolist() == [[PLAIN, ACTION, OBSERVATION, -1, -1, -1]]
    assert class_weights(classes, weights.table).tolist() == [[1, 3, 0.25, 0, 0, 0]]
    # the window divisor counts positions 1.. as transformers does: 3 + 0.25
    assert batch_weight_sum(padded, weights.table).item() == pytest.approx(3.25)
    assert batch_weight_sum(torch.tensor([[1, 2, -100, 4]]), weights.table).item() == 2


def _reference(logps: torch.Tensor, weights: torch.Tensor) -> float:
    """Plain Python loops, float64: sum over tokens 1.. of w * -logp / sum of w."""
    num = den = 0.0
    for b in range(weights.shape[0]):
        for t in range(1, weights.shape[1]):
            w = float(weights[b, t])
            num += w * -float(logps[b, t - 1])
            den += w
    return num / den


def test_weighted_nll_is_the_weighted_mean_of_the_shifted_tokens():
    g = torch.Generator().manual_seed(0)
    logps = -torch.rand(3, 6, generator=g) * 5
    weights = torch.tensor([[0, 1, 1, 0.3, 0.3, 0, 0], [0, 0, 2, 2, 0, 0, 0], [0, 1, 0, 0, 0, 0.3, 1]])
    out = weighted_nll(logps, align_weights(weights, 6))
    assert out.loss.item() == pytest.approx(_reference(logps, weights), rel=1e-6)
    assert out.weight_sum.item() == pytest.approx(float(weights[:, 1:].sum()))
    # DFT (TRL's loss_type="dft"): each term times its probability, the probability not differentiated
    dft = weighted_nll(logps, align_weights(weights, 6), dft=True).loss.item()
    expected = sum(
        float(weights[b, t]) * -float(logps[b, t - 1]) * float(logps[b, t - 1].exp())
        for b in range(3)
        for t in range(1, 7)
    ) / float(weights[:, 1:].sum())
    assert dft == pytest.approx(expected, rel=1e-6)


def test_unit_weights_give_trls_token_mean():
    logps = -torch.arange(1.0, 9.0).reshape(2, 4)
    weights = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
    expected = (1 + 2 + 6 + 7 + 8) / 5  # TRL: sum of -logp over labelled tokens / their number
    assert weighted_nll(logps, align_weights(weights, 4)).loss.item() == pytest.approx(expected)


def test_virtual_tokens_of_prompt_tuning_come_first_with_weight_zero():
    weights = torch.tensor([[0.0, 1.0, 2.0]])
    assert align_weights(weights, 5).tolist() == [[0, 0, 0, 1, 2]]
    with pytest.raises(ValueError, match="scored 1 positions for 2"):
        align_weights(weights, 1)


def test_micro_batches_over_the_window_divisor_sum_to_the_whole_batch_loss():
    g = torch.Generator().manual_seed(1)
    logps = -torch.rand(4, 7, generator=g)
    weights = torch.rand(4, 8, generator=g) * (torch.rand(4, 8, generator=g) > 0.4)
    whole = weighted_nll(logps, align_weights(weights, 7)).loss
    divisor = weights[:, 1:].sum()
    parts = sum(
        weighted_nll(logps[i : i + 2], align_weights(weights[i : i + 2], 7), divisor=divisor).loss for i in (0, 2)
    )
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_no_weighted_token_gives_a_connected_zero():
    logps = (-torch.rand(2, 3)).requires_grad_()
    out = weighted_nll(logps, torch.zeros(2, 3))
    out.loss.backward()
    assert out.loss.item() == 0.0 and logps.grad is not None and torch.isfinite(logps.grad).all()


def test_weighted_label_smoothing_with_unit_weights_is_transformers_label_smoother():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 11, generator=g)
    labels = torch.tensor([[-100, 3, 4, -100, 7], [-100, -100, 1, 2, 9]])
    expected = LabelSmoother(epsilon=0.1)({"logits": logits}, labels, shift_labels=True)
    ours = weighted_label_smoothing(logits, labels, (labels != -100).float(), 0.1)
    assert ours.loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_trains_actions():
    assert trains_actions(None, None) and trains_actions(-1.0, None)
    assert trains_actions(1.0, 1.0) and not trains_actions(0.9, 1.0) and not trains_actions(None, 0.0)
    assert not trains_actions(float("nan"), 0.0)


def test_min_reward_keeps_the_rows_at_or_above_it_and_streams():
    ds = Dataset.from_dict({"reward": [1.0, 0.1, None, 0.5], "x": [0, 1, 2, 3]})
    kept, report = filter_by_reward(ds, 0.5)
    assert kept["x"] == [0, 3] and (report.total, report.kept, report.dropped) == (4, 2, 2)
    assert "keeps 2 of 4 episodes" in report.summary()
    every, report = filter_by_reward(ds, 0.5, world_all_episodes=True)
    assert len(every) == 4 and report.kept == 2 and "--world_all_episodes" in report.summary()
    streamed, report = filter_by_reward(ds.to_iterable_dataset(), 0.5)
    assert [r["x"] for r in streamed] == [0, 3] and report.total is None and "\n" not in report.summary()


def test_min_reward_refuses_when_nothing_or_no_reward_is_left():
    with pytest.raises(EchoTrlError, match="no episode has reward >= 2"):
        filter_by_reward(Dataset.from_dict({"reward": [1.0]}), 2.0)
    with pytest.raises(EchoTrlError, match="needs a 'reward' column"):
        filter_by_reward(Dataset.from_dict({"x": [1]}), 0.0)
    np.testing.assert_equal(len(filter_by_reward(Dataset.from_dict({"reward": [1.0]}), 2.0, True)[0]), 1)
