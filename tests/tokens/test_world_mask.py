"""One world-loss mask, offline and online: targets, the per-observation cap, the filters."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.episodes import traj
from helpers.tiny import tiny_tokenizer

from echo_trl.roles import Role
from echo_trl.tokens.world_mask import world_mask
from echo_trl.train.batch import GeneratedRollouts
from echo_trl.train.offline.collator import CollatorSettings, trajectory_features
from echo_trl.train.online.masks import online_masks

C, A, E, W, OBS = (r.code for r in (Role.CONTEXT, Role.ACTION, Role.ENV_OUTPUT, Role.WARNING, Role.OBSERVATION))
#          action | observation 1 (wrapper, 3 env, warning) | action | observation 2 (two tool messages)
ROLES = [C, A, A, OBS, E, E, E, OBS, W, C, A, OBS, E, E, OBS, OBS, E, E, E, OBS, C]


def test_targets_widen_from_env_only_to_all():
    assert world_mask(ROLES, "env_only").tolist() == [r == E for r in ROLES]
    assert world_mask(ROLES, "observation").tolist() == [r in (E, OBS) for r in ROLES]
    assert world_mask(ROLES, "all").tolist() == [r in (E, OBS, W) for r in ROLES]
    with pytest.raises(ValueError, match="world_loss_target must be one of"):
        world_mask(ROLES, "everything")


@pytest.mark.parametrize(
    "target, cap, expected",
    [
        # the first 2 env tokens of each observation; observation 2 holds two tool messages, capped together
        ("env_only", 2, [4, 5, 12, 13]),
        ("env_only", 4, [4, 5, 6, 12, 13, 16, 17]),
        ("all", 3, [3, 4, 5, 11, 12, 13]),
        ("observation", 100, [3, 4, 5, 6, 7, 11, 12, 13, 14, 15, 16, 17, 18, 19]),
    ],
)
def test_cap_counts_world_tokens_per_observation(target, cap, expected):
    assert np.flatnonzero(world_mask(ROLES, target, max_tokens=cap)).tolist() == expected


def test_rows_are_independent_and_the_filters_drop_whole_rows():
    rows = np.array([ROLES, ROLES[::-1]])
    both = world_mask(rows, "env_only", max_tokens=2, passes=[True, True])
    assert both[0].tolist() == world_mask(ROLES, "env_only", max_tokens=2).tolist()
    assert both[1].tolist() == world_mask(ROLES[::-1], "env_only", max_tokens=2).tolist()
    dropped = world_mask(rows, "env_only", max_tokens=2, passes=[True, False])
    assert dropped[0].tolist() == both[0].tolist() and not dropped[1].any()
    assert not world_mask(ROLES, "all", passes=False).any()


@pytest.mark.parametrize("cap", [None, 1, 3])
def test_online_masks_equal_offline_collation_for_the_same_tokens(cap):
    """The same trajectory as a recording (offline) and as TRL's generated completion with its tool_mask
    and a rollout_func's env_output_mask (online): the same world mask, cap included."""
    tok = tiny_tokenizer("qwen3")
    settings = CollatorSettings(max_world_model_tokens=cap)
    t = traj(outputs=('{"items": [1, 2, 3, 4]}', "Error: no such product", "added"))
    f = trajectory_features(tok, t, settings)
    rollouts = GeneratedRollouts(
        [f.completion_ids], [f.action_mask], [t.completion], {"env_output_mask": [f.env_output_mask]}
    )
    ones = torch.ones(1, len(f.completion_ids), dtype=torch.long)
    masks = online_masks(
        rollouts,
        ones,
        torch.tensor([f.action_mask]),
        tokenizer=tok,
        tools=["search", "add"],
        settings=settings,
        render_suffix=lambda msgs: pytest.fail("not needed"),
    )
    assert masks.world_mask[0].tolist() == f.world_mask
    assert masks.env_output_mask[0].tolist() == f.env_output_mask
    if cap is not None:
        assert sum(f.world_mask) == sum(min(cap, n) for n in _env_runs(f.env_output_mask)) < sum(f.env_output_mask)


def _env_runs(mask):
    runs, n = [], 0
    for v in [*mask, 0]:
        if v:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    return runs
