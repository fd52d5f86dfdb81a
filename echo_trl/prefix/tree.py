"""Prefix tree of a micro-batch's token sequences: forward each shared token once, read it from every row.

Rows of one GRPO group share their whole prompt; rows of one AWM scenario share its system prompt and
tool schemas (thousands of tokens). :func:`build_prefix_tree` folds the rows into a compressed trie of
*segments* (runs of tokens forwarded once), and :class:`PrefixTree` lays them out as one packed
sequence in depth-first pre-order, with, for every row, the packed position of each of its tokens.

Two rules make the shared forward exact:

* a token is keyed on its id **and** its position (relative to the row's first real token), so rows
  with the same ids at different positions (holes in the attention mask) are never merged;
* a segment ends one token *before* the rows diverge: the last common token starts every child
  segment instead. A token's hidden state predicts the next token, so each packed position then has
  exactly one next-token label, and a per-position loss (TRL's fused LM head with ``shift_labels``)
  scores it once for every row that shares it. A branch costs one duplicated token.

Pure: numpy in, numpy out; no torch, no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IGNORE = -100  # label of a position whose next token is not scored (TRL's / PyTorch's ignore index)


@dataclass(frozen=True)
class Segment:
    """Tokens ``[start, end)`` of row ``row`` (every row below this segment holds the same ones there)."""

    parent: int  # index of the parent segment, -1 for a root
    row: int
    start: int
    end: int
    offset: int  # first packed position

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class PrefixTree:
    """Segments in depth-first pre-order (a parent before its children), and each row's root-to-leaf path."""

    ids: tuple[np.ndarray, ...]  # per row: token ids (padding removed)
    positions: tuple[np.ndarray, ...]  # per row: position ids
    segments: tuple[Segment, ...]
    paths: tuple[tuple[int, ...], ...]  # per row: its segments, root first (empty for an empty row)

    @property
    def num_tokens(self) -> int:
        """Tokens forwarded: the packed length."""
        return sum(s.length for s in self.segments)

    @property
    def total_tokens(self) -> int:
        """Tokens an unshared, padding-free forward would process."""
        return sum(len(x) for x in self.ids)

    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, positions, next_ids)`` of the packed sequence; ``next_ids`` is the token each position
        predicts (the next token on every path through it), :data:`IGNORE` at the end of a row."""
        ids, pos, nxt = [], [], []
        for s in self.segments:
            row_ids = self.ids[s.row]
            ids.append(row_ids[s.start : s.end])
            pos.append(self.positions[s.row][s.start : s.end])
            following = np.full(s.length, IGNORE, dtype=np.int64)
            stop = min(s.end + 1, len(row_ids))
            following[: stop - s.start - 1] = row_ids[s.start + 1 : stop]
            nxt.append(following)
        cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
        return cat(ids), cat(pos), cat(nxt)

    def row_index(self, row: int) -> np.ndarray:
        """Packed position of each token of ``row`` (its length)."""
        parts = [
            np.arange(self.segments[k].offset, self.segments[k].offset + self.segments[k].length)
            for k in self.paths[row]
        ]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def key_value_index(self, segment: int) -> np.ndarray:
        """Packed positions a segment's tokens attend to: its whole root-to-segment path, in order."""
        chain, k = [], segment
        while k >= 0:
            chain.append(k)
            k = self.segments[k].parent
        return np.concatenate(
            [
                np.arange(self.segments[k].offset, self.segments[k].offset + self.segments[k].length)
                for k in reversed(chain)
            ]
        )


def build_prefix_tree(
    ids: Sequence[Sequence[int]], positions: Sequence[Sequence[int]] | None = None, *, min_shared_tokens: int = 1
) -> PrefixTree:
    """Fold rows of token ids (and their position ids; default ``0..n-1``) into a :class:`PrefixTree`.

    A common prefix is shared only when it is at least ``min_shared_tokens`` long: a shared run of a
    few template tokens saves nothing and costs its children a causal mask over it.
    """
    rows = tuple(np.asarray(x, dtype=np.int64).reshape(-1) for x in ids)
    pos = tuple(
        np.arange(len(x), dtype=np.int64) if positions is None else np.asarray(p, dtype=np.int64).reshape(-1)
        for x, p in zip(rows, positions if positions is not None else rows, strict=True)
    )
    for r, (x, p) in enumerate(zip(rows, pos, strict=True)):
        if len(x) != len(p):
            raise ValueError(f"row {r}: {len(x)} token ids but {len(p)} position ids")
    segments: list[Segment] = []
    leaf_of: dict[int, int] = {}
    offset = 0

    def add(parent: int, row: int, start: int, end: int) -> int:
        nonlocal offset
        segments.append(Segment(parent, row, start, end, offset))
        offset += end - start
        return len(segments) - 1

    def common_end(group: list[int], start: int) -> int:
        """First index from ``start`` where the rows of ``group`` differ or one of them ends."""
        first, stop = group[0], min(len(rows[r]) for r in group)
        same = np.ones(stop - start, dtype=bool)
        for r in group[1:]:
            same &= (rows[r][start:stop] == rows[first][start:stop]) & (pos[r][start:stop] == pos[first][start:stop])
        return start + (int(np.argmin(same)) if not same.all() else stop - start)

    def build(group: list[int], start: int, parent: int) -> None:
        """Segments of ``group``: rows that agree on ``[0, start)`` and are all longer than ``start``."""
        end = common_end(group, start)
        if len(group) == 1 or all(len(rows[r]) == end for r in group):  # one row, or identical rows
            leaf = add(parent, group[0], start, len(rows[group[0]]))
            leaf_of.update(dict.fromkeys(group, leaf))
            return
        cut = end - 1  # the last common token opens every child (it predicts a different next token in each)
        if cut - start >= max(1, min_shared_tokens):
            parent, start = add(parent, group[0], start, cut), cut
        ended = [r for r in group if len(rows[r]) == end]
        branches: dict[tuple[int, int], list[int]] = {}
        for r in group:
            if len(rows[r]) > end:
                branches.setdefault((int(rows[r][end]), int(pos[r][end])), []).append(r)
        if ended:
            build(ended, start, parent)
        for branch in branches.values():
            build(branch, start, parent)

    live = [r for r in range(len(rows)) if len(rows[r])]
    if live:
        build(live, 0, -1)
    paths = []
    for r in range(len(rows)):
        chain, k = [], leaf_of.get(r, -1)
        while k >= 0:
            chain.append(k)
            k = segments[k].parent
        paths.append(tuple(reversed(chain)))
    return PrefixTree(rows, pos, tuple(segments), tuple(paths))


def rows_from_padded(
    input_ids: np.ndarray, attention_mask: np.ndarray, logits_to_keep: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """TRL's padded batch -> per row ``(ids, positions, scored columns)``.

    ``input_ids`` is ``cat(prompt_ids, completion_ids)`` (prompts left-padded, completions right-padded)
    and the last ``logits_to_keep`` columns are the completion, as in TRL's
    ``_get_per_token_logps_and_entropies``. A row keeps the tokens its ``attention_mask`` keeps; a
    token's position is its column minus the row's first kept column (the unshared forward counts
    columns, so relative distances, all that rotary attention sees, are the same). ``scored`` lists,
    per kept token, its completion column (``-1`` for prompt tokens): the column its log-prob goes to.
    """
    ids, pos, scored = [], [], []
    width = input_ids.shape[1]
    for row, mask in zip(np.asarray(input_ids), np.asarray(attention_mask).astype(bool), strict=True):
        cols = np.flatnonzero(mask)
        ids.append(row[cols].astype(np.int64))
        pos.append((cols - cols[0]).astype(np.int64) if len(cols) else cols.astype(np.int64))
        completion_col = cols - (width - logits_to_keep)
        scored.append(np.where(completion_col >= 0, completion_col, -1).astype(np.int64))
    return ids, pos, scored


def gather_index(tree: PrefixTree, scored: Sequence[np.ndarray], logits_to_keep: int) -> tuple[np.ndarray, np.ndarray]:
    """Where each row's completion log-probs come from in the packed sequence.

    Returns ``(index, needed)``: ``index`` (rows, ``logits_to_keep``) is the packed position whose
    prediction is each scored token (``num_tokens``, one past the end, where the column holds no
    scored token); ``needed`` (``num_tokens``) marks the packed positions any row reads. A row's
    first token has no predecessor and is never scored (TRL cannot score it either).
    """
    n = tree.num_tokens
    index = np.full((len(scored), logits_to_keep), n, dtype=np.int64)
    needed = np.zeros(n, dtype=bool)
    for r, cols in enumerate(scored):
        where = tree.row_index(r)
        take = np.flatnonzero(cols[1:] >= 0) + 1  # token i is predicted by position i - 1
        index[r, cols[take]] = where[take - 1]
        needed[where[take - 1]] = True
    return index, needed
