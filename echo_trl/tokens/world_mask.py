"""Which tokens the world-model loss trains on: one definition, offline and online.

Offline (recorded trajectories) the per-token roles come from :mod:`echo_trl.tokens.tokenization`; online
(completions TRL generated) :mod:`echo_trl.train.online.masks` derives the same role codes from TRL's
``tool_mask`` and the env-output mask it locates. Both then call :func:`world_mask`.

``max_world_model_tokens`` has one meaning: at most that many world-target tokens (the first ones)
of each *observation*, the environment's reply to one agent turn: every token between two action
turns, which holds all tool messages of a parallel call (one ``tool_mask == 0`` span of TRL's tool
loop, and the one user turn ChatML templates render consecutive tool messages into).
"""

from __future__ import annotations

import numpy as np

from ..roles import WORLD_LOSS_TARGETS, Role

_TARGET_ROLES = {
    "env_only": (Role.ENV_OUTPUT,),
    "observation": (Role.ENV_OUTPUT, Role.OBSERVATION),
    "all": (Role.ENV_OUTPUT, Role.OBSERVATION, Role.WARNING),
}


def target_codes(target: str) -> tuple[int, ...]:
    """The role codes ``world_loss_target`` trains on; a clear error for an unknown target."""
    if target not in WORLD_LOSS_TARGETS:
        raise ValueError(f"world_loss_target must be one of {', '.join(WORLD_LOSS_TARGETS)}, got {target!r}")
    return tuple(r.code for r in _TARGET_ROLES[target])


def observation_rank(roles: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """For each token: how many ``selected`` tokens its observation holds up to and including it.

    An observation starts after every action token (so it runs to the next action turn); rows are
    independent along the last axis.
    """
    is_action = roles == Role.ACTION.code
    segment = np.cumsum(is_action, axis=-1)
    count = np.cumsum(selected, axis=-1)
    start = np.ones_like(is_action)
    start[..., 1:] = segment[..., 1:] != segment[..., :-1]
    before = np.maximum.accumulate(np.where(start, count - selected, 0), axis=-1)
    return count - before


def world_mask(roles, target: str = "env_only", *, max_tokens: int | None = None, passes=True) -> np.ndarray:
    """Boolean world-loss mask of per-token ``roles`` (1-D, or 2-D rows).

    ``target``: a ``world_loss_target``; ``max_tokens``: ``max_world_model_tokens`` (per observation,
    see the module docstring); ``passes``: the rollout filters' verdict (one per row), ``False`` trains
    no world token of that row.
    """
    roles = np.asarray(roles)
    world = np.isin(roles, target_codes(target))
    if max_tokens is not None:
        world &= observation_rank(roles, world) <= max_tokens
    keep = np.asarray(passes, dtype=bool)
    return world & (keep[..., None] if keep.ndim else keep)
