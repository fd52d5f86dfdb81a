"""The SFT stage's loss on role-weighted tokens, pure: TRL's SFT loss with a weight per token.

TRL 1.16's ``SFTTrainer`` trains ``sum_t -log p_t / N`` over the tokens its labels keep (``loss_type="nll"``; ``dft``
multiplies each term by ``p_t``, detached), ``N`` being the count over the whole accumulation window of every
process. With per-token weights ``w_t`` (:mod:`.weights`) the same loss is::

    loss = sum_t w_t * l_t / sum_t w_t

so unit weights are TRL's loss exactly, and the divisor (:func:`~echo_trl.train.sft.weights.batch_weight_sum`,
summed over the window and processes as transformers sums the count) keeps gradient accumulation and data
parallelism exact. Dividing by the weight sum (not by the number of weighted tokens) keeps the loss continuous in the
weights: a tiny ``observation_weight`` changes the loss a tiny bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .weights import IGNORE_INDEX


@dataclass
class WeightedLoss:
    loss: torch.Tensor  # scalar, what backward sees (before the processes' scale)
    weighted_nll: torch.Tensor  # detached: sum of w * -log p on this micro-batch
    weight_sum: torch.Tensor  # detached: sum of w on this micro-batch


def align_weights(weights: torch.Tensor, positions: int) -> torch.Tensor:
    """Weights of the predicted tokens: ``weights`` (B, T) aligned with the input ids, shifted to (B, T-1) and, where
    the model scores more positions (prompt-tuning virtual tokens come first), padded with zeros on the left."""
    shifted = weights[..., 1:]
    extra = positions - shifted.shape[-1]
    if extra < 0:
        raise ValueError(f"the model scored {positions} positions for {shifted.shape[-1]} weighted ones")
    return F.pad(shifted, (extra, 0)) if extra else shifted


def weighted_nll(
    log_probs: torch.Tensor,
    weights: torch.Tensor,
    *,
    divisor: torch.Tensor | float | None = None,
    dft: bool = False,
) -> WeightedLoss:
    """``sum(w * l) / divisor`` with ``l = -log p`` (``dft``: ``-log p * p``, ``p`` detached, as TRL's DFT loss).

    ``log_probs`` (B, N) are the fused LM head's (zero where not scored), ``weights`` (B, N) already aligned
    (:func:`align_weights`). ``divisor`` is the window's weight sum; ``None``: this micro-batch's own. A zero divisor
    gives a connected zero, never NaN.
    """
    w = weights.to(torch.float32)
    per_token = -log_probs
    if dft:
        per_token = per_token * log_probs.exp().detach()
    weighted = (per_token * w).sum()
    local = w.sum()
    denom = local if divisor is None else torch.as_tensor(divisor, device=w.device).to(torch.float32)
    loss = weighted / denom.clamp(min=torch.finfo(torch.float32).tiny)
    return WeightedLoss(loss=loss, weighted_nll=weighted.detach(), weight_sum=local.detach())


def weighted_label_smoothing(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    epsilon: float,
    *,
    divisor: torch.Tensor | float | None = None,
) -> WeightedLoss:
    """transformers' ``LabelSmoother`` (shifted labels) with a weight per token:
    ``sum_t w_t ((1 - eps) * nll_t + eps * mean_v(-log p_v)) / divisor``; ``weights`` (B, T) aligned with the ids."""
    log_probs = -F.log_softmax(logits[..., :-1, :].float(), dim=-1)
    target = labels[..., 1:]
    w = weights[..., 1:].to(torch.float32)
    nll = log_probs.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    smooth = log_probs.mean(dim=-1)
    per_token = ((1 - epsilon) * nll + epsilon * smooth).masked_fill(target == IGNORE_INDEX, 0.0)
    weighted = (per_token * w).sum()
    local = w.sum()
    denom = local if divisor is None else torch.as_tensor(divisor, device=w.device).to(torch.float32)
    loss = weighted / denom.clamp(min=torch.finfo(torch.float32).tiny)
    return WeightedLoss(loss=loss, weighted_nll=weighted.detach(), weight_sum=local.detach())


def role_nll(log_probs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached ``(sum of -log p, count)`` over an aligned role ``mask`` (the per-role CE metrics)."""
    with torch.no_grad():
        m = mask.bool()
        return (-log_probs.float()).masked_fill(~m, 0.0).sum(), m.sum().float()
