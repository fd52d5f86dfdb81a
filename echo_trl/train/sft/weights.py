"""Per-token role weights of the SFT stage, and how they travel in TRL's ``labels`` column.

A token's weight comes from its role where the row has roles, and from TRL's own mask everywhere else:

* tool-message content (the world-target tokens of ``world_loss_target``, at most ``max_world_model_tokens`` per
  observation): ``observation_weight``, whether TRL's mask trains it or not (observation supervision);
* the assistant's tokens: ``action_weight`` where TRL's mask trains them (none in an episode ``min_reward`` keeps
  for its observations only);
* everything else: TRL's mask (1 or 0); harness warnings 0 unless ``world_loss_target="all"``.

TRL 1.16 folds its masks (``completion_mask``, ``assistant_masks``) into ``labels`` (-100: not trained) before it
truncates, packs and collates, and everything after that moves ``labels`` token by token: truncation, ``bfd`` /
``wrapped`` packing, padding-free flattening (with -100 at each sequence's first position). The weights ride
along the same way, so no step of TRL's needs to know about them: a trained token's label is its id plus its
*weight class* times ``2**32`` (:data:`PLAIN`: weight 1, TRL's own mask; :data:`ACTION`; :data:`OBSERVATION`),
read back by :func:`split_labels` right before the loss. A row without roles keeps TRL's labels unchanged, so a
dataset without them is exactly TRL's.

Pure: numpy and torch values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ...roles import Role
from ...tokens.world_mask import world_mask

IGNORE_INDEX = -100
#: Bits below the weight class: token ids (< 2**31 in every vocabulary) fit with room to spare.
CLASS_SHIFT = 32
_ID_BITS = (1 << CLASS_SHIFT) - 1
#: Weight classes of a trained token.
PLAIN, ACTION, OBSERVATION = 0, 1, 2


def trains_actions(reward: float | None, min_reward: float | None) -> bool:
    """Whether an episode's action tokens are trained: always without ``min_reward``; else only when its recorded
    reward is at least ``min_reward`` (an episode without a reward does not qualify)."""
    if min_reward is None:
        return True
    return reward is not None and math.isfinite(float(reward)) and float(reward) >= min_reward


@dataclass(frozen=True)
class SFTWeights:
    """The role-weight settings of an ``EchoSFTConfig``."""

    action_weight: float = 1.0
    observation_weight: float = 1.0
    world_loss_target: str = "env_only"
    max_world_model_tokens: int | None = None
    min_reward: float | None = None  # with world_all_episodes: episodes below it train their observations only
    max_completion_length: int | None = None  # ECHO trajectory datasets: completion tokens kept, cut at message ends

    @classmethod
    def from_args(cls, args) -> SFTWeights:
        return cls(
            action_weight=float(args.action_weight),
            observation_weight=float(args.observation_weight),
            world_loss_target=args.world_loss_target,
            max_world_model_tokens=args.max_world_model_tokens,
            min_reward=args.min_reward if args.world_all_episodes else None,
            max_completion_length=args.max_completion_length,
        )

    @property
    def table(self) -> tuple[float, float, float]:
        """The weight of each class: (:data:`PLAIN`, :data:`ACTION`, :data:`OBSERVATION`)."""
        return (1.0, self.action_weight, self.observation_weight)


def role_labels(input_ids, trl_labels, roles, weights: SFTWeights, *, train_actions: bool = True) -> list[int]:
    """The coded labels of one row: ``input_ids`` (as TRL tokenized them), ``trl_labels`` (TRL's, -100 where its
    masks do not train), per-token ``roles`` (``Role`` codes, aligned)."""
    ids = np.asarray(input_ids, dtype=np.int64)
    roles = np.asarray(roles, dtype=np.int8)
    trained = np.asarray(trl_labels, dtype=np.int64) != IGNORE_INDEX
    target = world_mask(roles, weights.world_loss_target)
    world = world_mask(roles, weights.world_loss_target, max_tokens=weights.max_world_model_tokens)
    action = (roles == Role.ACTION.code) & ~target
    untrained = ((roles == Role.WARNING.code) | target) & ~world  # warnings; observation tokens past the cap
    classes = np.where(world, OBSERVATION, np.where(action, ACTION, PLAIN)).astype(np.int64)
    keep = np.where(world, True, trained & ~untrained & train_actions)
    keep &= np.asarray(weights.table)[classes] > 0
    return np.where(keep, ids + (classes << CLASS_SHIFT), IGNORE_INDEX).tolist()


def split_labels(labels) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(labels, classes)`` of a collated batch's coded ``labels``: the token ids (-100 kept) and each token's
    weight class (-1 where not trained); ``None`` when no token carries a class (TRL's labels as they are)."""
    if not torch.is_tensor(labels) or labels.dtype != torch.int64 or not bool((labels > _ID_BITS).any()):
        return None
    trained = labels >= 0
    return torch.where(trained, labels & _ID_BITS, labels), torch.where(trained, labels >> CLASS_SHIFT, -1)


def class_weights(classes: torch.Tensor, table: tuple[float, ...]) -> torch.Tensor:
    """float32 weight per token from its class (0 where -1: not trained)."""
    lookup = torch.tensor((0.0, *table), dtype=torch.float32, device=classes.device)
    return lookup[classes + 1]


def batch_weight_sum(labels: torch.Tensor, table: tuple[float, ...]) -> torch.Tensor:
    """The weight sum of a batch's predicted tokens (positions 1..T-1, as transformers counts ``num_items``):
    TRL's label count when the labels carry no class."""
    split = split_labels(labels)
    if split is None:
        return labels[..., 1:].ne(IGNORE_INDEX).sum().double()
    return class_weights(split[1][..., 1:], table).double().sum()
