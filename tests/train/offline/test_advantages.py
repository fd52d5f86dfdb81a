"""GRPO advantages of recorded trajectories, grouped by group_id, against TRL's formulas."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from datasets import Dataset

from echo_trl.train.offline.advantages import collated_advantages, group_advantages, with_advantages


def test_group_advantages_follow_trl_formulas():
    rewards = [1.0, 0.0, 0.5, 1.0, 0.3]
    groups = ["a", "b", "a", "b", "c"]
    adv = group_advantages(rewards, groups, "group")
    # group a: mean .75, std(ddof=1) = .35355; group b: mean .5, std .70711; c alone: 0
    assert adv == pytest.approx(
        [0.25 / (0.353553 + 1e-4), -0.5 / (0.707107 + 1e-4), -0.25 / (0.353553 + 1e-4), 0.5 / (0.707107 + 1e-4), 0.0],
        rel=1e-5,
    )
    none = group_advantages(rewards, groups, "none")
    assert none == pytest.approx([0.25, -0.5, -0.25, 0.5, 0.0])
    # "batch": centred only here; the generation batch's std divides it at collation (below)
    assert group_advantages(rewards, groups, "batch") == pytest.approx(none)
    assert group_advantages([1.0, 1.0], ["x", "x"], "group") == pytest.approx([0.0, 0.0])


@pytest.mark.parametrize("processes", [1, 2])
def test_batch_scaling_uses_the_generation_batch_std_as_trl(processes):
    """scale_rewards="batch": (reward - mean of its group over the dataset) / (std of the generation batch's
    rewards, all processes, ddof=1, + 1e-4), computed here independently with numpy."""
    rng = np.random.default_rng(0)
    rewards = rng.uniform(-1, 1, 12).round(3).tolist()
    groups = [f"g{i % 4}" for i in range(12)]
    ds = with_advantages(Dataset.from_dict({"reward": rewards, "group_id": groups}), "batch", "train")
    rows = ds.to_list()
    order = rng.permutation(12).tolist()
    batch = [rows[i] for i in order[:6]]  # one generation batch, spread over `processes`
    per = len(batch) // processes
    shards = [batch[k * per : (k + 1) * per] for k in range(processes)]

    def gather(t):  # accelerator.gather over the processes' shards
        return torch.cat([torch.tensor([r["reward"] for r in shard], dtype=t.dtype) for shard in shards])

    got = torch.cat([collated_advantages(shard, "batch", gather)[0] for shard in shards]).numpy()
    group_mean = {g: np.mean([r for r, h in zip(rewards, groups, strict=True) if h == g]) for g in set(groups)}
    batch_rewards = np.array([rewards[i] for i in order[:6]])
    expected = [(rewards[i] - group_mean[groups[i]]) / (np.std(batch_rewards, ddof=1) + 1e-4) for i in order[:6]]
    assert got == pytest.approx(expected, rel=1e-5)
    # the whole dataset's std (the old behaviour) differs: the batch std is what TRL divides by
    assert not np.allclose(
        got, [(rewards[i] - group_mean[groups[i]]) / (np.std(rewards, ddof=1) + 1e-4) for i in order[:6]], rtol=1e-3
    )
    # other settings read the stored advantage as is
    stored = torch.tensor([r["echo_advantage"] for r in batch], dtype=torch.float32)
    assert torch.equal(collated_advantages(batch, "group", gather)[0], stored)


def test_a_generation_batch_of_equal_rewards_gets_zero_advantages_not_times_10000():
    ds = with_advantages(
        Dataset.from_dict({"reward": [1.0, 0.0, 1.0, 1.0], "group_id": ["a", "a", "b", "c"]}), "batch", "train"
    )
    rows = ds.to_list()
    assert rows[0]["echo_advantage"] == 0.5  # centred by its dataset group
    adv, rewards = collated_advantages([rows[0], rows[2]], "batch", lambda t: t)  # both rewards 1.0: std 0
    assert adv.tolist() == [0.0, 0.0] and rewards.tolist() == [1.0, 1.0]
