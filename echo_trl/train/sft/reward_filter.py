"""Which recorded episodes the SFT stage trains on, from their rewards.

SFT imitates: an episode that failed teaches failure. ``min_reward`` keeps the episodes whose ``reward`` column is
at least that (AWM: 1.0 completed, 0.1 incomplete, -1.0 format error); an episode without a reward does not
qualify. Its observations are still true statements about the environment, so with ``world_all_episodes`` every
episode stays and the filtered-out ones train only the observation tokens (their other weights are 0,
:func:`echo_trl.train.sft.weights.trains_actions`), as ECHO's world term learns from every rollout.
"""

from __future__ import annotations

from dataclasses import dataclass

from datasets import Dataset

from ...data.store import column_values
from ...errors import EchoTrlError
from .weights import trains_actions


@dataclass(frozen=True)
class RewardFilter:
    """What :func:`filter_by_reward` did (``total`` / ``kept`` are ``None`` for a streaming dataset: not counted)."""

    min_reward: float | None
    world_all_episodes: bool
    total: int | None
    kept: int | None  # episodes whose actions train

    @property
    def dropped(self) -> int | None:
        return None if self.total is None or self.kept is None else self.total - self.kept

    def summary(self, name: str = "train_dataset") -> str:
        """One line for the user."""
        if self.min_reward is None:
            return f"{name}: all {'' if self.total is None else f'{self.total} '}episodes trained (no --min_reward)"
        rest = "their observations still train (--world_all_episodes)" if self.world_all_episodes else "dropped"
        if self.total is None:
            return (
                f"{name}: --min_reward {self.min_reward:g} trains the actions of episodes with reward >= it; "
                f"the rest: {rest}"
            )
        return (
            f"{name}: --min_reward {self.min_reward:g} keeps {self.kept} of {self.total} episodes for the action "
            f"tokens; {self.dropped} below it (or without a reward): {rest}"
        )


def filter_by_reward(dataset, min_reward: float | None, world_all_episodes: bool = False, name: str = "train_dataset"):
    """``(dataset, RewardFilter)``: the episodes with reward >= ``min_reward`` (all of them with
    ``world_all_episodes``: their weights are set when the dataset is prepared). Refuses, in one line, a dataset
    without a ``reward`` column and a filter that leaves nothing to train on. A streaming dataset is filtered
    lazily (not counted)."""
    if dataset is None or min_reward is None:
        total = len(dataset) if isinstance(dataset, Dataset) else None
        return dataset, RewardFilter(None, world_all_episodes, total, total)
    if "reward" not in (dataset.column_names or []):
        raise EchoTrlError(f"{name}: --min_reward needs a 'reward' column; the dataset has none")
    if not isinstance(dataset, Dataset):
        if not world_all_episodes:
            dataset = dataset.filter(lambda row: trains_actions(row["reward"], min_reward))
        return dataset, RewardFilter(min_reward, world_all_episodes, None, None)
    total = len(dataset)
    keep = [trains_actions(r, min_reward) for r in column_values(dataset, "reward")]
    report = RewardFilter(min_reward, world_all_episodes, total, sum(keep))
    if report.kept == 0 and not world_all_episodes:
        raise EchoTrlError(
            f"{name}: no episode has reward >= {min_reward:g} (of {total}); lower --min_reward, or add "
            "--world_all_episodes to train the observations of all of them"
        )
    if world_all_episodes:
        return dataset, report
    return dataset.select([i for i, k in enumerate(keep) if k]), report
