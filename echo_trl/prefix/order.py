"""Epoch order that puts trajectories sharing a prefix into the same micro-batch.

Prefix sharing (:mod:`echo_trl.prefix.attention`) saves only what one micro-batch shares. A uniformly
shuffled epoch scatters a GRPO group's G trajectories over G micro-batches; this order keeps them
next to each other (and a scenario's groups next to each other, for its tool preamble) while
changing nothing about *what* an epoch trains on: it is a permutation of the rows, drawn from
``(seed, epoch)`` alone, so a resumed run replays the same order.

How it maps onto TRL's ``RepeatSampler(mini_repeat_count, batch_size, repeat_count)`` (offline:
``mini_repeat_count = 1``, ``batch_size = generation_batch_size``, ``repeat_count = num_iterations *
steps_per_generation``): the order replaces ``torch.randperm``; :func:`repeat_like_trl` then cuts it
into generation batches exactly as TRL does (an incomplete last batch is dropped, as TRL drops it),
and the trainer splits each generation batch into ``steps_per_generation`` consecutive micro-batches
of ``per_device_train_batch_size`` rows (per process), which therefore hold consecutive rows of the
order.

Pure: Python and numpy.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import numpy as np

__all__ = ["prefix_grouped_order"]


def prefix_grouped_order(
    group_ids: Sequence[Hashable],
    scenario_ids: Sequence[Hashable] | None = None,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[int]:
    """A permutation of ``range(len(group_ids))`` with each group's rows contiguous, and within a
    scenario its groups contiguous.

    The order of scenarios, of groups within a scenario and of rows within a group is drawn from a
    generator seeded with ``(seed, epoch)`` (a pure function of them). ``shuffle=False`` keeps the
    first-appearance order of scenarios, groups and rows (still grouped).
    """
    scenario_ids = group_ids if scenario_ids is None else scenario_ids
    if len(scenario_ids) != len(group_ids):
        raise ValueError(f"{len(group_ids)} group ids but {len(scenario_ids)} scenario ids")
    tree: dict[Hashable, dict[Hashable, list[int]]] = {}
    for i, (scenario, group) in enumerate(zip(scenario_ids, group_ids, strict=True)):
        tree.setdefault(scenario, {}).setdefault(group, []).append(i)
    rng = np.random.default_rng([int(seed) % 2**63, int(epoch)]) if shuffle else None

    def arrange(items: list):
        return [items[k] for k in rng.permutation(len(items))] if rng is not None else items

    order: list[int] = []
    for groups in arrange(list(tree.values())):
        for rows in arrange(list(groups.values())):
            order += arrange(rows)
    return order


def repeat_like_trl(
    order: Sequence[int], batch_size: int, repeat_count: int = 1, mini_repeat_count: int = 1
) -> Iterator[int]:
    """The index stream TRL's ``RepeatSampler`` yields, for a given epoch ``order`` instead of its ``randperm``:
    chunks of ``batch_size`` (an incomplete last chunk dropped), each chunk ``repeat_count`` times, each
    index ``mini_repeat_count`` times in a row."""
    chunks = [list(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    for chunk in chunks:
        if len(chunk) < batch_size:
            continue
        for _ in range(repeat_count):
            for index in chunk:
                yield from [index] * mini_repeat_count


def blocks_in_drawn_order(row_keys: Sequence[Hashable], permutation: Sequence[int]) -> list[int]:
    """A permutation of the rows that keeps each block (a run of consecutive rows with equal keys: online, the G
    generations of a prompt, which TRL's ``RepeatSampler`` puts next to each other) contiguous and in its order,
    with the blocks ordered as ``permutation`` (a random draw of rows) first meets one of their rows.

    Online, TRL 1.16 shuffles the generation batch row by row (``torch.randperm``) before cutting it into
    micro-batches, which scatters a group over them; this shuffles whole groups instead, from the same draw (so the
    random stream is consumed exactly as TRL consumes it).
    """
    n = len(row_keys)
    if sorted(int(i) for i in permutation) != list(range(n)):
        raise ValueError(f"not a permutation of {n} rows")
    starts = [i for i in range(n) if i == 0 or row_keys[i] != row_keys[i - 1]]
    block_of = np.zeros(n, dtype=np.int64)
    for b, start in enumerate(starts):
        block_of[start:] = b
    first_seen: dict[int, int] = {}
    for rank, row in enumerate(permutation):
        first_seen.setdefault(int(block_of[int(row)]), rank)
    ends = [*starts[1:], n]
    return [i for b in sorted(first_seen, key=first_seen.get) for i in range(starts[b], ends[b])]
