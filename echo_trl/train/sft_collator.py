"""SFT batches from recorded trajectory rows, with the GRPO side's tokens and role masks.

A row's tokens and masks are :func:`echo_trl.train.collator.trajectory_features`' (the cached token columns of
:mod:`echo_trl.tokens.cache`, cut at message ends, the world mask of ``world_loss_target`` and
``max_world_model_tokens``), exactly what ``EchoGRPOTrainer`` collates for the same row. Here prompt and
completion stay side by side (right-padded) as TRL's SFT batch is, with

* ``labels``: the token ids where the weight is positive, ``-100`` elsewhere (TRL's convention);
* :data:`~echo_trl.train.sft_loss.WEIGHTS`: per-token role weights (:func:`~echo_trl.train.sft_loss.role_weights`);
* the action and world masks, for the per-role metrics.

Pure: a tokenizer and Python/torch values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .collator import CollatorSettings, trajectory_features
from .sft_loss import ACTION_MASK, WEIGHTS, WORLD_MASK, labels_for, role_weights


def trains_actions(reward: float | None, min_reward: float | None) -> bool:
    """Whether an episode's action tokens are trained: always without ``min_reward``; else only when its recorded
    reward is at least ``min_reward`` (an episode without a reward does not qualify)."""
    if min_reward is None:
        return True
    return reward is not None and float(reward) >= min_reward


@dataclass(frozen=True)
class SFTWeights:
    """The role weights of the SFT loss (read from an ``EchoSFTConfig``)."""

    action_weight: float = 1.0
    world_model_coeff: float = 1.0
    min_reward: float | None = None  # action tokens of episodes below it get weight 0 (world_all_episodes)

    @classmethod
    def from_args(cls, args) -> SFTWeights:
        return cls(args.action_weight, args.world_model_coeff, args.min_reward if args.world_all_episodes else None)


@dataclass
class SFTExample:
    input_ids: list[int]
    weights: np.ndarray  # float32, aligned with input_ids
    action_mask: np.ndarray  # bool, aligned with input_ids
    world_mask: np.ndarray


def sft_example(tokenizer, row: dict[str, Any], settings: CollatorSettings, weights: SFTWeights) -> SFTExample:
    """One trajectory's ids, weights and role masks over the whole sequence (prompt tokens: weight 0)."""
    f = trajectory_features(tokenizer, row, settings)
    p = len(f.prompt_ids)
    action = np.zeros(p + len(f.completion_ids), dtype=bool)
    world = np.zeros_like(action)
    action[p:] = np.asarray(f.action_mask, dtype=bool)
    world[p:] = np.asarray(f.world_mask, dtype=bool)
    w = role_weights(
        action,
        world,
        action_weight=weights.action_weight,
        world_model_coeff=weights.world_model_coeff,
        train_actions=trains_actions(row.get("reward"), weights.min_reward),
    )
    return SFTExample(f.prompt_ids + f.completion_ids, w, action, world)


def collate_sft(examples: list[SFTExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad examples into ``input_ids``, ``attention_mask``, ``labels``, the weights and the role masks."""
    width = max(len(e.input_ids) for e in examples)
    n = len(examples)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    weights = torch.zeros((n, width), dtype=torch.float32)
    action = torch.zeros((n, width), dtype=torch.bool)
    world = torch.zeros((n, width), dtype=torch.bool)
    for i, e in enumerate(examples):
        k = len(e.input_ids)
        input_ids[i, :k] = torch.tensor(e.input_ids, dtype=torch.long)
        attention[i, :k] = 1
        weights[i, :k] = torch.from_numpy(e.weights)
        action[i, :k] = torch.from_numpy(e.action_mask)
        world[i, :k] = torch.from_numpy(e.world_mask)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "labels": labels_for(input_ids, weights),
        WEIGHTS: weights,
        ACTION_MASK: action,
        WORLD_MASK: world,
    }


@dataclass
class SFTCollator:
    """The trainer's ``data_collator``: trajectory rows (with or without cached tokens) -> an SFT batch."""

    tokenizer: Any
    settings: CollatorSettings
    weights: SFTWeights

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        examples = [sft_example(self.tokenizer, row, self.settings, self.weights) for row in rows]
        return collate_sft(examples, self.tokenizer.pad_token_id)
