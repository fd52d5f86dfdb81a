"""The metrics ECHO logs per batch, in one place (TRL averages each list at every log).

Every value is global: summed or gathered over all processes before it is appended, so each
process logs the same number. A rate is appended as a ``(numerator, denominator)`` pair and logged as
sum(numerators) / sum(denominators) over the logging window (:func:`reduce_rates`, as TRL 1.16's AsyncGRPO
``_reduce_metric`` does), never as a mean of per-batch ratios.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .loss import WorldTotals

Gather = Callable[[torch.Tensor], torch.Tensor]


def log_offline_batch(
    m: dict[str, list[float]],
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    features,
    gather: Gather,
) -> None:
    """Reward / length metrics as TRL logs them for generated batches, plus the world-term filters and cuts."""
    all_rewards = gather(rewards)
    m["reward"].append(all_rewards.mean().item())
    m["reward_std"].append(all_rewards.std().item() if all_rewards.numel() > 1 else 0.0)
    m["frac_reward_zero_std"].append(gather((advantages == 0).float()).mean().item())
    m["completions/mean_length"].append(gather(completion_mask.sum(1).float()).mean().item())
    stats = torch.tensor(
        [[sum(not f.passes for f in features), sum(f.truncated_tokens for f in features), len(features)]],
        dtype=torch.float32,
        device=rewards.device,
    )
    filtered, truncated, n = gather(stats).sum(0).tolist()
    m["world/filtered_rollouts"].append(filtered)
    m["world/filtered_frac"].append(filtered / max(n, 1.0))
    m["world/truncated_tokens"].append(truncated)


def log_online_batch(m: dict[str, list[float]], passes: torch.Tensor, align_failures: int, gather: Gather) -> None:
    """Rollouts the filters kept out of the world term, and those whose env output could not be located."""
    m["world/filtered_rollouts"].append(gather((~passes).sum().float()).sum().item())
    m["world/online_align_failures"].append(
        gather(torch.tensor(float(align_failures), device=passes.device)).sum().item()
    )


def log_token_use(m: dict[str, list], own: int, run: int, trained: int, reduce: Gather, device=None) -> None:
    """One loss forward's token use, named and defined as TRL 1.16's AsyncGRPO logs them:

    * ``batch/packing_ratio``: the samples' own tokens (padding excluded) / the tokens actually run through the
      model (the packed tree when prefixes are shared; the padded rows for TRL's forward). Above 1 = shared;
    * ``batch/masked_token_frac``: the share of the samples' own tokens that no loss term trains on (prompt,
      template and, unless the world term trains on them, environment outputs).
    """
    own, run, trained = reduce(torch.tensor([own, run, trained], dtype=torch.float64, device=device)).tolist()
    m["batch/packing_ratio"].append((own, run))
    m["batch/masked_token_frac"].append((own - trained, own))


def reduce_rates(m: dict[str, list]) -> None:
    """Replace each ``(numerator, denominator)`` list in ``m`` by its one rate, sum / sum (NaN for a zero
    denominator), before TRL averages the lists at a log."""
    for key, values in m.items():
        if values and isinstance(values[0], tuple):
            numerator, denominator = (sum(v) for v in zip(*values, strict=True))
            m[key] = [numerator / denominator if denominator else float("nan")]


def log_world_term(
    m: dict[str, list[float]], totals: WorldTotals, coeff: float, held_out: dict[str, float] | None
) -> None:
    """World-term metrics of one micro-batch from its all-reduced ``totals``. ``held_out`` (evaluation): the CE
    over the whole evaluation so far, replacing the per-batch CE."""
    if held_out is None:
        if totals.env_tokens > 0:
            m["world/ce_env"].append(totals.env_nll / totals.env_tokens)
        if totals.warning_tokens > 0:
            m["world/ce_warning"].append(totals.warning_nll / totals.warning_tokens)
    else:
        for key, value in held_out.items():
            m[key] = [value]
    unscaled = totals.loss_numerator / totals.loss_count if totals.loss_count > 0 else 0.0
    m["world/loss_unscaled"].append(unscaled)
    m["world/loss_scaled"].append(coeff * unscaled)
    m["world/coeff"].append(coeff)
    m["world/tokens_env"].append(totals.env_tokens)
    m["world/tokens_warning"].append(totals.warning_tokens)
    m["world/tokens_action"].append(totals.action_tokens)
