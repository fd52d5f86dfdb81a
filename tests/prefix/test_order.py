"""The grouped epoch order: a permutation, a pure function of (seed, epoch), groups and scenarios contiguous;
and the stream TRL's RepeatSampler makes of it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from trl.trainer.utils import RepeatSampler

from echo_trl.prefix.order import blocks_in_drawn_order, prefix_grouped_order, repeat_like_trl


def _runs(labels):
    """Number of maximal runs of equal consecutive labels."""
    return sum(1 for _ in itertools.groupby(labels))


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=0, max_size=40),
    st.integers(0, 10**6),
    st.integers(0, 5),
)
def test_permutation_with_groups_and_scenarios_contiguous(rows, seed, epoch):
    scenarios = [f"s{s}" for s, _ in rows]
    groups = [f"s{s}/g{g}" for s, g in rows]
    order = prefix_grouped_order(groups, scenarios, seed=seed, epoch=epoch)
    assert sorted(order) == list(range(len(rows)))  # each trajectory exactly once
    assert _runs([groups[i] for i in order]) == len(set(groups))
    assert _runs([scenarios[i] for i in order]) == len(set(scenarios))
    assert order == prefix_grouped_order(groups, scenarios, seed=seed, epoch=epoch)  # pure in (seed, epoch)


def test_order_changes_with_seed_and_epoch_and_shuffles_inside_groups():
    groups = [f"g{i % 6}" for i in range(60)]
    scenarios = [f"s{i % 2}" for i in range(60)]
    orders = {
        (s, e): tuple(prefix_grouped_order(groups, scenarios, seed=s, epoch=e)) for s in (0, 1) for e in (0, 1, 2)
    }
    assert len(set(orders.values())) == len(orders)
    first_rows = {tuple(o[:10]) for o in orders.values()}  # rows inside a group move too, not only groups
    assert len(first_rows) > 1
    # a later epoch's order needs no earlier epoch (resume): computed fresh it is the same
    assert tuple(prefix_grouped_order(groups, scenarios, seed=1, epoch=2)) == orders[(1, 2)]


def test_unshuffled_order_keeps_first_appearance():
    groups = ["b", "a", "b", "c", "a"]
    assert prefix_grouped_order(groups, seed=0, epoch=0, shuffle=False) == [0, 2, 1, 4, 3]
    assert prefix_grouped_order(groups, ["x", "y", "x", "x", "y"], seed=0, epoch=0, shuffle=False) == [0, 2, 3, 1, 4]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="3 group ids but 2 scenario ids"):
        prefix_grouped_order(["a", "b", "c"], ["x", "y"], seed=0, epoch=0)


@pytest.mark.parametrize(("n", "batch", "repeat", "mini"), [(7, 3, 2, 1), (8, 4, 1, 2), (6, 6, 3, 1), (5, 8, 1, 1)])
def test_stream_matches_trls_repeat_sampler(n, batch, repeat, mini):
    want = list(
        RepeatSampler(list(range(n)), mini_repeat_count=mini, batch_size=batch, repeat_count=repeat, shuffle=False)
    )
    assert list(repeat_like_trl(list(range(n)), batch, repeat, mini)) == want


def test_blocks_move_whole_in_the_order_the_draw_first_meets_them():
    keys = ["a", "a", "b", "b", "b", "a", "c"]  # "a" twice, apart: two blocks (a block is a run of equal keys)
    assert blocks_in_drawn_order(keys, [6, 3, 0, 1, 2, 4, 5]) == [6, 2, 3, 4, 0, 1, 5]
    assert blocks_in_drawn_order(keys, list(range(7))) == list(range(7))
    for seed in range(5):
        draw = np.random.default_rng(seed).permutation(7).tolist()
        out = blocks_in_drawn_order(keys, draw)
        assert sorted(out) == list(range(7))
        for start, size in ((0, 2), (2, 3), (5, 1), (6, 1)):  # each block contiguous, in its own order
            first = out.index(start)
            assert out[first : first + size] == list(range(start, start + size))
    with pytest.raises(ValueError, match="not a permutation of 7 rows"):
        blocks_in_drawn_order(keys, [0, 0, 1, 2, 3, 4, 5])
