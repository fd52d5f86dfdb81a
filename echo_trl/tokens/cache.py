"""Tokenize once: every trajectory's token ids and per-token roles as cached dataset columns.

Rendering a 30-tool AWM preamble through a chat template and tokenizing a long episode costs
more than a tiny model's forward, so the trainer must not do it inside every step of every
epoch. :func:`tokenize_dataset` renders and tokenizes each row once (the exact
:func:`~echo_trl.tokens.tokenization.tokenize_batch`: ids are ``tokenizer(rendered_text)``), stores the
result as columns, and caches them the ``datasets`` way: ``Dataset.map`` with a fingerprint of
(dataset content, tokenizer, chat template, echo_trl's token-layout version), so the next epoch, the
next run and the evaluation reuse the same Arrow file instead of tokenizing again. The dataset part is
:func:`~echo_trl.data.content.dataset_content_key` (a content hash of its Arrow files, remembered per
file version), so an Arrow file edited in place is tokenized again, never served from the old cache.

Cache files are written whole or not at all (:func:`map_to_cache`): into a private temporary directory
beside the final file, then renamed; a full disk is one line naming the file and the space it needs.

The columns hold the *whole* trajectory; cuts (``max_completion_length``) and world-loss targets
are applied later on these tokens (:func:`row_tokens` then ``RoleTokens.truncate``), so one cache
serves every setting. Beside the tokens each row keeps its rollout quality (:data:`QUALITY`,
:func:`~echo_trl.tokens.quality.rollout_quality`, which depends on the row alone), so no batch decodes a
cached row back into messages to recompute it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from datasets import Features, List, Value

from ..data.cache_dir import cache_home
from ..data.content import dataset_content_key
from ..data.schema import row_to_trajectory
from ..io.atomic import staging_dir
from ..io.outputs import disk_full_error, is_disk_full
from .quality import QUALITY_KEYS, rollout_quality, with_dataset_columns
from .tokenization import RoleTokens, tokenize_rows

__all__ = ["tokenize_dataset", "row_tokens", "tokenizer_fingerprint", "map_to_cache"]

#: Bumped whenever the meaning of the cached columns changes (roles, spans), so stale caches are not reused.
LAYOUT_VERSION = "4"

IDS, ROLES, PROMPT_LENGTH, MESSAGE_ENDS = "echo_input_ids", "echo_roles", "echo_prompt_length", "echo_message_ends"
#: The row's rollout quality (:data:`~echo_trl.tokens.quality.QUALITY_KEYS`, derived from its messages).
QUALITY = "echo_quality"
#: The columns :func:`tokenize_dataset` adds.
TOKEN_COLUMNS = (IDS, ROLES, PROMPT_LENGTH, MESSAGE_ENDS, QUALITY)
TOKEN_FEATURES = {
    IDS: List(Value("int32")),
    ROLES: List(Value("int8")),
    PROMPT_LENGTH: Value("int32"),
    MESSAGE_ENDS: List(Value("int32")),
    QUALITY: {key: Value("float64") for key in QUALITY_KEYS},
}


def cache_root() -> Path:
    """Where token caches of in-memory datasets go (``tokens`` under :func:`cache_home`)."""
    return cache_home() / "tokens"


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything that decides the tokens: vocabulary and merges, added tokens, chat template.

    Two tokenizers with the same fingerprint tokenize every conversation identically; a changed chat
    template (or an added special token) changes it, so a cache built with another template is never used.
    """
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # slow tokenizer: its vocabulary stands in for the model file
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    template = getattr(tokenizer, "chat_template", None)
    h.update(json.dumps(template, sort_keys=True).encode())
    added = sorted((i, t.content, t.special) for i, t in tokenizer.added_tokens_decoder.items())
    h.update(json.dumps([type(tokenizer).__name__, added]).encode())
    return h.hexdigest()[:16]


def _fingerprint(ds: datasets.Dataset, tokenizer) -> str:
    key = f"{dataset_content_key(ds)}/{tokenizer_fingerprint(tokenizer)}/{LAYOUT_VERSION}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _tokenize_rows(batch: dict[str, list], indices: list[int], tokenizer) -> dict[str, list]:
    rows = [{k: v[i] for k, v in batch.items()} for i in range(len(indices))]
    tokens = tokenize_rows(
        tokenizer, rows, indices, label=lambda index, row: f"row {index} (group_id {row.get('group_id')!r})"
    )
    trajectories = [row_to_trajectory(row) for row in rows]  # valid: tokenize_rows named any that is not
    return {
        IDS: [t.input_ids for t in tokens],
        ROLES: [t.roles.tolist() for t in tokens],
        PROMPT_LENGTH: [t.prompt_length for t in tokens],
        MESSAGE_ENDS: [[end for _, end in t.message_token_spans] for t in tokens],
        QUALITY: [rollout_quality(t.completion, t.tools, t.warnings) for t in trajectories],
    }


def cache_file_for(ds: datasets.Dataset, prefix: str, fingerprint: str) -> str | None:
    """Where a derived column set of ``ds`` is cached: next to the dataset's own Arrow files when that
    directory is writable (datasets' convention), else under :func:`cache_root`; ``None`` (keep in
    memory) when neither can be written."""
    candidates = [Path(f["filename"]).parent for f in ds.cache_files[:1]] + [cache_root()]
    for directory in candidates:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return str(directory / f"{prefix}-{fingerprint}.arrow")
    return None


def tokenize_dataset(ds: datasets.Dataset, tokenizer, *, show_progress: bool | None = None) -> datasets.Dataset:
    """``ds`` with :data:`TOKEN_COLUMNS` added: each trajectory rendered and tokenized exactly once.

    Already-tokenized datasets (same fingerprint) load from the cache file without touching the
    tokenizer. A row that cannot be rendered is an :class:`EchoTrlError` naming its index and group.
    """
    ds = ds.remove_columns([c for c in TOKEN_COLUMNS if c in ds.column_names])
    fingerprint = _fingerprint(ds, tokenizer)
    cache_file = cache_file_for(ds, "echo-tokens", fingerprint)
    with map_progress(show_progress):
        return map_to_cache(
            ds,
            _tokenize_rows,
            cache_file,
            fingerprint,
            batched=True,
            batch_size=64,
            with_indices=True,
            fn_kwargs={"tokenizer": tokenizer},
            features=Features({**ds.features, **TOKEN_FEATURES}),
            desc="tokenizing trajectories (once per tokenizer)",
        )


def map_to_cache(
    ds: datasets.Dataset, function: Callable, cache_file: str | None, fingerprint: str, **map_kwargs: Any
) -> datasets.Dataset:
    """``ds.map(function, **map_kwargs)`` cached in ``cache_file`` (in memory when ``None``), which is written
    whole or not at all.

    ``datasets`` writes a cache file through a ``tmpXXXX`` file beside it and, when the disk fills, can leave
    that file behind. Here the first ``map`` writes inside a private temporary directory (its ``tmpXXXX``
    too), the finished file is renamed into place and the directory is always removed; the second ``map``
    loads the file. A full disk is an :class:`~echo_trl.errors.EchoTrlError` naming ``cache_file`` and about
    the space it needs (``ds``'s own data; a little more in fact: the file holds every column plus the new ones).
    """
    if cache_file is None:
        return ds.map(function, new_fingerprint=fingerprint, keep_in_memory=True, **map_kwargs)
    if not os.path.exists(cache_file):
        try:
            with staging_dir(cache_file, prefix=".echo-trl-writing-") as work:
                part = os.path.join(work, os.path.basename(cache_file))
                kwargs = {**map_kwargs, "load_from_cache_file": False}
                ds.map(function, new_fingerprint=fingerprint, cache_file_name=part, **kwargs)
                os.replace(part, cache_file)
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(cache_file, ds.data.nbytes) from None
            raise
    return ds.map(
        function, new_fingerprint=fingerprint, cache_file_name=cache_file, load_from_cache_file=True, **map_kwargs
    )


@contextmanager
def map_progress(show: bool | None) -> Iterator[None]:
    """``datasets``' progress bars inside the block: off when ``show`` is False (or None with
    ``ECHO_TRL_PROGRESS=0``), as they were afterwards."""
    disable = show is False or (show is None and os.environ.get("ECHO_TRL_PROGRESS") == "0")
    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    if disable:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if disable and was_enabled:
            datasets.enable_progress_bars()


def has_tokens(row: dict[str, Any]) -> bool:
    """Whether a row carries the columns of :func:`tokenize_dataset`."""
    return all(row.get(c) is not None for c in TOKEN_COLUMNS)


def row_quality(row: dict[str, Any]) -> dict[str, float]:
    """The rollout quality of a row with :func:`tokenize_dataset`'s columns: the cached values, where the dataset
    carries no columns of :data:`~echo_trl.tokens.quality.QUALITY_KEYS` of its own (those override them)."""
    return with_dataset_columns(dict(row[QUALITY]), row)


def row_tokens(row: dict[str, Any]) -> RoleTokens:
    """The cached tokens of one row as :class:`~echo_trl.tokens.tokenization.RoleTokens` (no rendering).

    The rendered text is not cached (the trainer never needs it), so ``text`` is empty and the
    per-message character ends are unknown (zeros).
    """
    p = int(row[PROMPT_LENGTH])
    ends = [int(e) for e in row[MESSAGE_ENDS]]
    spans = [(p if k == 0 else ends[k - 1], e) for k, e in enumerate(ends)]
    return RoleTokens(
        list(row[IDS]),
        np.asarray(row[ROLES], dtype=np.int8),
        p,
        message_token_spans=spans,
        message_char_ends=[0] * len(ends),
    )
