"""The ECHO world-model term, pure: per-token log-probs + masks + settings -> (loss, metrics).

No TRL, no model: the trainer passes the log-probs its GRPO forward already computed.

Normalization is exact under gradient accumulation and data parallelism because the divisor is
a *global* count (tokens, or trajectories with world tokens) gathered over the whole generation
batch and every process before the micro-batches are cut, rescaled exactly like TRL 1.16 rescales
``num_items_in_batch`` for its ``dapo`` loss::

    divisor = global_count / num_processes * (gradient_accumulation_steps / steps_per_generation)

With DDP averaging gradients over processes and the trainer summing micro-batch gradients, the
accumulated gradient is then the gradient of ``sum(CE over the window) / global_count``.

Exact when ``steps_per_generation == gradient_accumulation_steps`` (TRL's default): one optimizer
step then covers the whole generation batch. Otherwise a step covers ``gradient_accumulation_steps``
of the generation batch's ``steps_per_generation`` shuffled micro-batches, and its divisor is the
generation batch's count x ``gradient_accumulation_steps / steps_per_generation``: right on average
over steps, but each step's gradient is scaled by (its window's share of the count) / (its share of
the micro-batches). TRL 1.16's own ``dapo`` / ``cispo`` / ``vespo`` policy term has the same property.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from ..batch import CompletionMasks


@dataclass
class WorldLoss:
    """The world term of one micro-batch."""

    loss: torch.Tensor  # scalar, normalized by the divisor (what gets lambda and backward)
    numerator: torch.Tensor  # detached: sum of the per-token (token) or per-sequence (*sequence*) CE
    count: torch.Tensor  # detached: local world tokens, sequences with world tokens, or all sequences
    local_mean: torch.Tensor  # detached: numerator / count on this micro-batch (0 when count is 0)


@dataclass(frozen=True)
class WorldTotals:
    """One micro-batch's sums, added over every process: what the world-term metrics and the held-out CE read."""

    env_nll: float  # sum of -logp over env-output tokens
    env_tokens: float
    warning_nll: float  # sum of -logp over warning tokens
    warning_tokens: float
    loss_numerator: float  # the world loss's numerator and count (WorldLoss)
    loss_count: float
    action_tokens: float


def masked_nll(per_token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``-logp`` where ``mask``, exact zeros elsewhere (NaN-safe, gradient only through masked tokens).

    Half-precision log-probs are upcast to float32 first: every sum of these values (the loss, the metrics)
    then accumulates and is stored in float32. A bf16 sum of thousands of CEs is rounded to 8 bits of
    mantissa (about 0.3% off), and a bf16 divisor rounds the token count too. Gradients still reach the
    half-precision input (the cast is differentiable). TRL 1.16's fused LM head already returns float32
    log-probs; this keeps the sums exact for any other producer (other TRL versions, direct callers).
    """
    nll = -per_token_logps.to(torch.promote_types(per_token_logps.dtype, torch.float32))
    return nll.masked_fill(~mask.bool(), 0.0)


def nll_sum_and_count(per_token_logps: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Detached ``(sum of -logp, number of tokens)`` over ``mask``: the parts of a token-mean CE metric."""
    with torch.no_grad():
        return masked_nll(per_token_logps, mask).sum().float(), mask.bool().sum().float()


def global_count(mask: torch.Tensor, normalization: str) -> torch.Tensor:
    """What ``normalization`` divides by, counted on (a batch of) ``mask``: world tokens (``token``), sequences
    with world tokens (``sequence``) or every sequence, with world tokens or not (``all_sequences``, echo-rl's)."""
    mask = mask.bool()
    if normalization == "token":
        return mask.sum().float()
    if normalization == "sequence":
        return mask.any(dim=-1).sum().float()
    if normalization == "all_sequences":
        return torch.tensor(float(mask.shape[0]) if mask.dim() > 1 else 1.0, device=mask.device)
    raise ValueError(f"unknown world_loss_normalization {normalization!r}")


def world_loss(
    per_token_logps: torch.Tensor,
    world_mask: torch.Tensor,
    *,
    normalization: str = "sequence",
    divisor: torch.Tensor | float | None = None,
) -> WorldLoss:
    """Cross-entropy of the ``world_mask`` tokens from their log-probs.

    ``per_token_logps`` (B, T) are log-probabilities of the realised next tokens, ``world_mask``
    (B, T) selects the tokens the world model learns. ``divisor`` is the (already rescaled) global
    count from :func:`divisor_for`; ``None`` divides by this micro-batch's own count (a plain mean).

    A batch without world tokens gives a zero that is still connected to the graph (never NaN).
    """
    mask = world_mask.bool()
    nll = masked_nll(per_token_logps, mask)
    if normalization == "token":
        numerator = nll.sum()
        count = mask.sum().float()
    elif normalization in ("sequence", "all_sequences"):
        per_seq_count = mask.sum(-1)
        numerator = (nll.sum(-1) / per_seq_count.clamp(min=1)).sum()
        count = global_count(mask, normalization).to(nll.dtype)
    else:
        raise ValueError(f"unknown world_loss_normalization {normalization!r}")
    if divisor is None:
        denom = count.clamp(min=1.0)
    else:
        denom = torch.as_tensor(divisor, dtype=nll.dtype, device=nll.device)
        denom = torch.where(denom > 0, denom, torch.ones_like(denom))  # no world tokens anywhere: 0 / 1
    loss = numerator / denom
    with torch.no_grad():
        local_mean = numerator.detach() / count.clamp(min=1.0)
    return WorldLoss(loss=loss, numerator=numerator.detach(), count=count.detach(), local_mean=local_mean)


def divisor_for(
    count_over_generation_batch: torch.Tensor,
    *,
    num_processes: int,
    gradient_accumulation_steps: int,
    steps_per_generation: int,
    training: bool,
) -> torch.Tensor:
    """The divisor of one micro-batch's world loss, from the count over the gathered generation batch.

    Mirrors TRL's ``dapo`` normalizer: the generation batch spans ``steps_per_generation`` micro-batches
    of every process; one optimizer step accumulates ``gradient_accumulation_steps`` of them.
    In evaluation the batch is neither split nor accumulated.
    """
    divisor = count_over_generation_batch.float().clamp(min=1.0) / num_processes
    if training:
        divisor = divisor * gradient_accumulation_steps / steps_per_generation
    return divisor


def world_divisor(
    world_num_items: torch.Tensor | None,
    world_mask: torch.Tensor,
    args,
    accelerator,
    gradient_accumulation_steps: int,
    training: bool,
) -> torch.Tensor:
    """:func:`divisor_for` of a micro-batch: its generation batch's world-token count as the collator recorded it
    (``world_num_items``), else counted here and gathered over the processes (TRL's online batch)."""
    if world_num_items is None:
        world_num_items = accelerator.gather(global_count(world_mask, args.world_loss_normalization)).sum()
    return divisor_for(
        world_num_items,
        num_processes=accelerator.num_processes,
        gradient_accumulation_steps=gradient_accumulation_steps,
        steps_per_generation=args.steps_per_generation,
        training=training,
    )


def world_coeff_at(
    step: int,
    *,
    coeff: float,
    schedule: str = "constant",
    end: float = 0.0,
    steps: list[int] | None = None,
    values: list[float] | None = None,
    max_steps: int | None = None,
) -> float:
    """Lambda at optimizer step ``step`` (0-based) under the configured schedule."""
    if schedule == "constant":
        return float(coeff)
    if schedule == "linear_decay":
        horizon = steps[0] if steps else max_steps
        if not horizon or horizon <= 0:
            return float(coeff)
        frac = min(max(step, 0) / horizon, 1.0)
        return float(coeff + (end - coeff) * frac)
    if schedule == "step_decay":
        current = float(coeff)
        for boundary, value in zip(steps or [], values or [], strict=True):
            if step >= boundary:
                current = float(value)
        return current
    raise ValueError(f"unknown world_model_coeff_schedule {schedule!r}")


def world_coeff_for(args, step: int, max_steps: int | None = None) -> float:
    """:func:`world_coeff_at` under the schedule an ``EchoGRPOConfig`` (``args``) configures."""
    return world_coeff_at(
        step,
        coeff=args.world_model_coeff,
        schedule=args.world_model_coeff_schedule,
        end=args.world_model_coeff_end,
        steps=args.world_model_coeff_steps,
        values=args.world_model_coeff_values,
        max_steps=max_steps,
    )


def world_totals(
    ce_logps: torch.Tensor,
    masks: CompletionMasks,
    loss: WorldLoss,
    reduce: Callable[[torch.Tensor], torch.Tensor],
) -> WorldTotals:
    """The :class:`WorldTotals` of one micro-batch: its CE sums at ``ce_logps``, its world loss's numerator and
    count, and its action tokens, summed over processes by ``reduce`` (one all-reduce for all of them)."""
    env_nll, env_tokens = nll_sum_and_count(ce_logps, masks.env_output)
    warning_nll, warning_tokens = nll_sum_and_count(ce_logps, masks.warning)
    local = {
        "env_nll": env_nll,
        "env_tokens": env_tokens,
        "warning_nll": warning_nll,
        "warning_tokens": warning_tokens,
        "loss_numerator": loss.numerator.float(),
        "loss_count": loss.count.float(),
        "action_tokens": masks.action.sum().float(),
    }
    names = [f.name for f in fields(WorldTotals)]
    summed = reduce(torch.stack([local[name] for name in names])).tolist()
    return WorldTotals(**dict(zip(names, summed, strict=True)))
