"""The metrics ECHO logs per batch, in one place (TRL averages each list at every log).

Every value is global: summed or gathered over all processes before it is appended, so each
process logs the same number.
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
