"""GRPO advantages of recorded trajectories, grouped by group_id, against TRL's formulas."""

from __future__ import annotations

import numpy as np
import pytest

from echo_trl.advantages import group_advantages


def test_group_advantages_follow_trl_formulas():
    rewards = [1.0, 0.0, 0.5, 1.0, 0.3]
    groups = ["a", "b", "a", "b", "c"]
    adv = group_advantages(rewards, groups, "group")
    # group a: mean .75, std(ddof=1) = .35355; group b: mean .5, std .70711; c alone: 0
    assert adv == pytest.approx([0.25 / (0.353553 + 1e-4), -0.5 / (0.707107 + 1e-4), -0.25 / (0.353553 + 1e-4),
                                 0.5 / (0.707107 + 1e-4), 0.0], rel=1e-5)
    none = group_advantages(rewards, groups, "none")
    assert none == pytest.approx([0.25, -0.5, -0.25, 0.5, 0.0])
    batch = group_advantages(rewards, groups, "batch")
    assert batch == pytest.approx(none / (np.std(rewards, ddof=1) + 1e-4))
    assert group_advantages([1.0, 1.0], ["x", "x"], "group") == pytest.approx([0.0, 0.0])
