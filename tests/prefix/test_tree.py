"""The prefix tree: every row is exactly its path, each packed position has one next token, shared tokens
appear once, and TRL's padded layout maps onto it column for column."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from echo_trl.prefix.tree import IGNORE, build_prefix_tree, gather_index, rows_from_padded


def _check_invariants(tree, rows, positions=None):
    ids, pos, nxt = tree.packed()
    assert len(ids) == tree.num_tokens
    for r, row in enumerate(rows):
        where = tree.row_index(r)
        np.testing.assert_array_equal(ids[where], row)  # the path spells the row
        want_pos = np.arange(len(row)) if positions is None else positions[r]
        np.testing.assert_array_equal(pos[where], want_pos)
        if len(row):
            np.testing.assert_array_equal(nxt[where[:-1]], row[1:])  # one next token per packed position
            assert tree.key_value_index(tree.paths[r][-1]).tolist() == where.tolist()  # attends to its own row
    for s in tree.segments:  # pre-order: a parent precedes its children in the packed sequence
        assert s.parent < 0 or tree.segments[s.parent].offset < s.offset
    return ids, nxt


def test_group_sharing_a_prompt_forwards_it_once():
    prompt = list(range(100, 140))
    rows = [prompt + c for c in ([1, 2, 3], [4, 5], [6, 7, 8, 9])]
    tree = build_prefix_tree(rows)
    _check_invariants(tree, [np.array(r) for r in rows])
    # the shared prompt minus its last token (which opens each branch) once, plus each row's own tokens
    assert tree.num_tokens == sum(map(len, rows)) - 2 * (len(prompt) - 1)
    assert [len(p) for p in tree.paths] == [2, 2, 2]


def test_two_levels_preamble_then_group_prompt():
    pre = list(range(200, 260))
    a, b = pre + [1, 1, 1, 1, 1], pre + [2, 2, 2, 2]
    rows = [a + [10, 11], a + [12], b + [13, 14, 15], b + [16]]
    tree = build_prefix_tree(rows)
    _check_invariants(tree, [np.array(r) for r in rows])
    assert [len(p) for p in tree.paths] == [3, 3, 3, 3]  # preamble -> task prompt -> completion
    assert tree.paths[0][:2] == tree.paths[1][:2] and tree.paths[0][0] == tree.paths[2][0]


def test_min_shared_tokens_leaves_short_common_prefixes_unshared():
    rows = [[1, 2, 3, 4, 50, 51], [1, 2, 3, 4, 60]]
    assert build_prefix_tree(rows, min_shared_tokens=3).num_tokens < sum(map(len, rows))
    tree = build_prefix_tree(rows, min_shared_tokens=4)  # 3 shareable tokens (1, 2, 3) < 4
    assert tree.num_tokens == sum(map(len, rows)) and all(len(p) == 1 for p in tree.paths)


def test_same_ids_at_other_positions_are_not_merged():
    tree = build_prefix_tree([[5, 6, 7, 8], [5, 6, 7, 9]], [[0, 1, 2, 3], [1, 2, 3, 4]])
    assert tree.num_tokens == 8
    _check_invariants(tree, [np.array([5, 6, 7, 8]), np.array([5, 6, 7, 9])], [[0, 1, 2, 3], [1, 2, 3, 4]])


def test_identical_prefix_rows_and_empty_rows():
    rows = [[1, 2, 3], [1, 2, 3], [1, 2, 3, 4, 5], [], [1, 2]]
    tree = build_prefix_tree(rows)
    _check_invariants(tree, [np.array(r, dtype=np.int64) for r in rows])
    assert tree.paths[0] == tree.paths[1] and tree.paths[3] == ()
    assert tree.total_tokens == 13


@given(st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=12), min_size=1, max_size=7), st.integers(1, 4))
def test_invariants_on_random_rows(rows, min_shared):
    """A 3-token alphabet makes long shared prefixes, branch points anywhere and duplicate rows common."""
    tree = build_prefix_tree(rows, min_shared_tokens=min_shared)
    _check_invariants(tree, [np.array(r, dtype=np.int64) for r in rows])
    assert tree.num_tokens <= tree.total_tokens
    if min_shared == 1:  # as few tokens as a trie keyed on (prefix, next token) has nodes
        keys = {(tuple(r[: i + 1]), r[i + 1] if i + 1 < len(r) else None) for r in rows for i in range(len(r))}
        assert tree.num_tokens == len(keys)


def test_rows_from_trl_padded_layout_and_gather_index():
    # prompts left-padded (pad 0), completions right-padded; row 2 has its completion masked out
    input_ids = np.array([[0, 7, 8, 1, 2, 0], [7, 8, 9, 3, 0, 0], [0, 0, 7, 4, 5, 6]])
    mask = np.array([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0]])
    ids, pos, scored = rows_from_padded(input_ids, mask, logits_to_keep=3)
    assert [x.tolist() for x in ids] == [[7, 8, 1, 2], [7, 8, 9, 3], [7]]
    assert [x.tolist() for x in pos] == [[0, 1, 2, 3], [0, 1, 2, 3], [0]]
    assert [x.tolist() for x in scored] == [[-1, -1, 0, 1], [-1, -1, -1, 0], [-1]]
    tree = build_prefix_tree(ids, pos)
    index, needed = gather_index(tree, scored, 3)
    packed, _, nxt = tree.packed()
    n = tree.num_tokens
    # each scored column reads the position holding its predecessor, whose next token is the scored token
    for r, c in [(0, 0), (0, 1), (1, 0)]:
        assert nxt[index[r, c]] == input_ids[r, 3 + c]
    assert index[0, 2] == n and (index[1, 1:] == n).all() and (index[2] == n).all()
    assert needed.sum() == 3 and nxt[needed].tolist() != [IGNORE] * 3


def test_mismatched_positions_are_refused():
    with pytest.raises(ValueError, match="row 0"):
        build_prefix_tree([[1, 2, 3]], [[0, 1]])
