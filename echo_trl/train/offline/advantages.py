"""GRPO advantages of recorded trajectories, from their recorded rewards (offline mode).

TRL computes advantages over the completions it just generated, grouped by position; recorded
trajectories carry their group in ``group_id`` instead, so the advantages are computed once over
the whole dataset and stored in a column the offline batches read. With ``scale_rewards="batch"``
the column holds ``reward - group mean`` and :func:`collated_advantages` divides it by the std of
the generation batch's rewards when the batch is collated, as TRL does.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from ...data.store import column_values
from ...errors import DatasetSchemaError
from ...tokens.cache import add_row_column

#: Column holding each recorded trajectory's precomputed GRPO advantage.
ADVANTAGE_COLUMN = "echo_advantage"


def group_advantages(rewards: Sequence[float], group_ids: Sequence[str], scale_rewards: str = "group") -> np.ndarray:
    """GRPO advantages of recorded trajectories, grouped by ``group_id`` (not by position).

    Same formulas as TRL 1.16's ``sum_then_normalize``: ``reward - group mean``, divided by
    ``std + 1e-4`` where ``scale_rewards`` is ``"group"`` (Bessel-corrected std of the group), not
    divided for ``"none"`` nor for ``"batch"``: TRL divides by the std of the generation batch's rewards,
    which only the collated batch knows (:func:`collated_advantages`). A group of one gets 0.

    The group mean stays over the group's rows in the whole dataset: a recorded group is what TRL would
    have generated together for one prompt, but the offline sampler draws trajectories one by one, so a
    generation batch often holds only part of a group (or one row of it: a mean over that part would
    zero its advantage).
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    r = np.asarray(rewards, dtype=np.float64)
    index: dict = {}
    codes = np.fromiter((index.setdefault(g, len(index)) for g in group_ids), dtype=np.int64, count=len(r))
    # Per-group sums over all rows at once (a loop over groups costs seconds at 100k episodes).
    size = np.bincount(codes, minlength=len(index))
    adv = r - (np.bincount(codes, weights=r, minlength=len(index)) / size)[codes]  # every group has a row
    if scale_rewards == "group":
        std = np.sqrt(np.bincount(codes, weights=adv * adv, minlength=len(index)) / np.maximum(size - 1, 1))
        adv = adv / (std[codes] + 1e-4)
    adv[size[codes] < 2] = 0.0  # a group of one: nothing to compare with (it still trains the world term)
    return adv


def with_advantages(ds, scale_rewards: str, name: str):
    """``ds`` (a trajectory ``Dataset``) with :data:`ADVANTAGE_COLUMN` (recomputed if present).

    Groups come from ``group_id``, else ``scenario/task_idx``, else every row alone. Without a
    ``reward`` column every advantage is 0 (a warning says so: only the world term trains).
    """
    if ADVANTAGE_COLUMN in ds.column_names:
        ds = ds.remove_columns(ADVANTAGE_COLUMN)
    if "reward" not in ds.column_names:
        warnings.warn(
            f"{name} has no 'reward' column: every advantage is 0, only the world term trains",
            UserWarning,
            stacklevel=3,
        )
        adv = np.zeros(len(ds))
    else:
        rewards = column_values(ds, "reward")
        if any(r is None or not math.isfinite(r) for r in rewards):
            raise DatasetSchemaError(f"{name}: every trajectory needs a finite 'reward'")
        if "group_id" in ds.column_names:
            groups = column_values(ds, "group_id")
        elif {"scenario", "task_idx"} <= set(ds.column_names):
            pairs = zip(column_values(ds, "scenario"), column_values(ds, "task_idx"), strict=True)
            groups = [f"{s}/{t}" for s, t in pairs]
        else:
            groups = [str(i) for i in range(len(ds))]
        adv = group_advantages(rewards, groups, scale_rewards)
    return add_row_column(ds, ADVANTAGE_COLUMN, adv.tolist())  # a row selection kept: no copy, the same token cache


def collated_advantages(
    rows: Sequence[dict], scale_rewards: str, gather, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, rewards)`` of one process's rows of a generation batch (offline collation).

    ``scale_rewards="batch"``: the stored ``reward - group mean`` divided by ``std + 1e-4``, the
    Bessel-corrected std of the rewards of the whole generation batch, every process's rows
    (``gather``: ``accelerator.gather``), as TRL 1.16's ``_generate_and_score_completions`` does
    (std 0 for a batch of one row). A batch whose rewards are all equal (std 0) gets advantage 0, as
    in TRL. Otherwise the stored advantage as is.
    """
    advantages = torch.tensor([float(row.get(ADVANTAGE_COLUMN) or 0.0) for row in rows], device=device)
    rewards = torch.tensor([float(row.get("reward") or 0.0) for row in rows], device=device)
    if scale_rewards == "batch":
        everyone = gather(rewards).double()
        std = everyone.std(unbiased=True) if everyone.numel() > 1 else everyone.new_zeros(())
        scaled = advantages.double() / (std + 1e-4)
        # A batch of equal rewards: TRL's advantages are all 0 (its group means are the batch's); centred by the
        # dataset's group means they are not, and dividing them by 1e-4 would multiply them by 10,000.
        advantages = (
            torch.zeros_like(advantages) if torch.isclose(std, std.new_zeros(())) else scaled.to(advantages.dtype)
        )
    return advantages, rewards
