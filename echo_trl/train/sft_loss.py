"""The SFT stage's loss, pure: per-token log-probs + per-token role weights -> (loss, metrics).

Each token of a trajectory gets a weight from its role (:func:`role_weights`): ``action_weight`` on the agent's
own tokens, ``world_model_coeff`` on the world-target tokens (env_output, as the ECHO world term picks them),
0 on context and warnings. The loss is the weighted mean cross-entropy::

    loss = sum_t w_t * CE_t / sum_t w_t

With unit weights this is TRL's SFT loss (sum of CE over the supervised tokens / their number), so
``world_model_coeff = 0`` is TRL's SFT on the action tokens, and ``world_model_coeff = action_weight`` is plain
SFT on actions and observations alike. Dividing by the weight sum (not by the number of weighted tokens) keeps
the loss continuous in the coefficients: a tiny ``world_model_coeff`` changes the loss a tiny bit, instead of
letting every observation token dilute the action tokens' share at once.

Exact under gradient accumulation and several processes: the divisor is the weight sum over the whole
accumulation window of every process (TRL's ``num_items_in_batch``, :func:`window_weight_sum`), each
micro-batch's loss is its own weighted sum over that divisor, times the number of processes that DDP's gradient
average divides by again (as TRL's SFT loss does with ``average_tokens_across_devices``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

#: The per-token weight column of an SFT batch (aligned with ``input_ids``: the weight of predicting that token).
WEIGHTS = "echo_sft_weights"
#: Per-token role masks of an SFT batch (aligned with ``input_ids``), read by the metrics only.
ACTION_MASK, WORLD_MASK = "echo_sft_action_mask", "echo_sft_world_mask"
#: Columns an SFT batch carries beside the model's inputs (removed before the forward).
EXTRA_COLUMNS = (WEIGHTS, ACTION_MASK, WORLD_MASK)
IGNORE_INDEX = -100


def role_weights(
    action_mask: np.ndarray,
    world_mask: np.ndarray,
    *,
    action_weight: float,
    world_model_coeff: float,
    train_actions: bool = True,
) -> np.ndarray:
    """Per-token weights: ``action_weight`` on action tokens (0 when ``train_actions`` is False: an episode kept for
    its observations only), ``world_model_coeff`` on world-target tokens, 0 elsewhere (the masks are disjoint)."""
    action = np.asarray(action_mask, dtype=bool)
    world = np.asarray(world_mask, dtype=bool)
    if (action & world).any():
        raise ValueError("action and world masks overlap")
    weights = np.zeros(action.shape, dtype=np.float32)
    if train_actions:
        weights[action] = action_weight
    weights[world] = world_model_coeff
    return weights


def labels_for(input_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """TRL's ``labels``: the token ids where the weight is positive, ``-100`` elsewhere (so the fused LM head scores
    only weighted tokens)."""
    return input_ids.masked_fill(weights <= 0, IGNORE_INDEX)


def window_weight_sum(batches: list[dict]) -> torch.Tensor:
    """The weight sum of the predicted tokens (positions 1..T-1) over the micro-batches of one accumulation window."""
    return sum((b[WEIGHTS][..., 1:].double().sum() for b in batches), torch.zeros((), dtype=torch.float64))


@dataclass
class SFTLoss:
    loss: torch.Tensor  # scalar, what backward sees
    weighted_nll: torch.Tensor  # detached: sum of w * CE on this micro-batch
    weight_sum: torch.Tensor  # detached: sum of w on this micro-batch


def weighted_ce(
    log_probs: torch.Tensor,
    weights: torch.Tensor,
    *,
    divisor: torch.Tensor | float | None = None,
    scale: float = 1.0,
) -> SFTLoss:
    """``scale * sum(w * -logp) / divisor`` over shifted tokens.

    ``log_probs`` (B, T-1) are the log-probs of tokens 1..T-1 (zero where unscored), ``weights`` (B, T) are aligned
    with the input ids. ``divisor`` is the window's weight sum (:func:`window_weight_sum`, gathered over processes),
    ``None`` this micro-batch's own; a zero divisor gives a connected zero, never NaN.
    """
    w = weights[..., 1:].to(torch.float32)
    nll = -log_probs.to(torch.promote_types(log_probs.dtype, torch.float32))
    weighted = (nll * w).masked_fill(w <= 0, 0.0).sum()
    local = w.sum()
    denom = local if divisor is None else torch.as_tensor(divisor, dtype=torch.float32, device=w.device)
    loss = weighted / denom.clamp(min=torch.finfo(torch.float32).tiny) * scale
    return SFTLoss(loss=loss, weighted_nll=weighted.detach(), weight_sum=local.detach())


def role_nll(log_probs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached ``(sum of -logp, count)`` over a role ``mask`` (B, T) aligned with the input ids."""
    with torch.no_grad():
        m = mask[..., 1:].bool()
        return (-log_probs.float()).masked_fill(~m, 0.0).sum(), m.sum().float()
