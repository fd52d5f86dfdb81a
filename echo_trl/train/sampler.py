"""The epoch order of training rows: TRL's ``RepeatSampler``, made resume-exact (and prefix-grouped offline).

Built on TRL 1.16's ``RepeatSampler``: its fields and its one-generator-per-sampler shuffling
(``tests/train/test_trl_compat.py`` checks both).
"""

from __future__ import annotations

import torch
from trl.trainer.utils import RepeatSampler

from ..prefix.order import prefix_grouped_order, repeat_like_trl


class ResumableRepeatSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` with the order of epoch ``e`` a function of ``(seed, e)``: resume-exact.

    TRL draws each epoch's permutation from one generator seeded once, so epoch ``e``'s order depends on
    the sampler having been iterated ``e`` times before. ``Trainer`` resuming from a checkpoint in epoch
    ``e >= 1`` builds a fresh sampler and starts at epoch ``e`` (it only calls ``set_epoch(e)``), for which
    TRL's sampler gives epoch 0's order. Here ``__iter__`` re-seeds and discards the first ``e`` permutations: the
    same order as TRL's for every epoch of an uninterrupted run, and the same order after a resume.

    With ``groups = (group_ids, scenario_ids)`` each epoch's order is instead
    :func:`~echo_trl.prefix.order.prefix_grouped_order` of ``(seed, epoch)`` (a group's rows, and a scenario's
    groups, next to each other for prefix sharing), cut and repeated exactly as TRL's.
    """

    def __init__(self, *args, groups: tuple[list, list | None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch = 0
        self.groups = groups

    @classmethod
    def like(cls, sampler):
        """The resumable version of TRL's ``RepeatSampler`` ``sampler`` (same settings); anything else as is."""
        if type(sampler) is not RepeatSampler:
            return sampler
        return cls(
            data_source=sampler.data_source,
            mini_repeat_count=sampler.mini_repeat_count,
            batch_size=sampler.batch_size,
            repeat_count=sampler.repeat_count,
            shuffle=sampler.shuffle,
            seed=sampler.seed,
        )

    def set_epoch(self, epoch: int) -> None:  # accelerate's DataLoaderShard calls it before every epoch
        self.epoch = epoch

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1  # without set_epoch: consecutive epochs, as TRL's
        if self.groups is not None:
            order = prefix_grouped_order(
                self.groups[0], self.groups[1], seed=self.seed or 0, epoch=epoch, shuffle=self.shuffle
            )
            return repeat_like_trl(order, self.batch_size, self.repeat_count, self.mini_repeat_count)
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)
        return super().__iter__()
