"""Tokenize once: every trajectory's token ids and per-token roles in a token-only cache shared by every command.

Rendering a 30-tool AWM preamble through a chat template and tokenizing a long episode costs
more than a tiny model's forward, so no step renders a row. :func:`tokenize_dataset` renders and tokenizes
each row once (the exact :func:`~echo_trl.tokens.tokenization.tokenize_batch`: ids are
``tokenizer(rendered_text)``) and keeps only the token columns (:data:`TOKEN_COLUMNS`: ids, roles, prompt
length, message ends and the row's rollout quality) in one cache per (source content, tokenizer with its chat
template, :data:`LAYOUT_VERSION`), under ``$ECHO_TRL_CACHE/tokens/`` (default ``~/.cache/echo_trl``; never in the
user's dataset directory). ``train``, ``sft``, ``stats`` and ``eval-world-model`` read the same cache.

The *source* is the Arrow data under the dataset (:func:`source_key`): the columns a rendering reads, before any
row selection. Rows are joined to the cache by their source row index without a copy (the dataset's own index
mapping is kept), so a shuffle, a split, a reward filter (``select``), added columns (advantages, scaled
rewards) or dropped ones all find the same cache: only the data decide. A file-backed part of the data is
keyed by the SHA-256 of its Arrow file (:func:`~echo_trl.data.content.file_digest`, once per file version)
and the operations ``datasets`` replays on it; an in-memory part by its bytes.

A build runs in ``num_proc`` processes (``datasets.map``, default: the cores available) behind a progress bar
with an ETA, into a private staging directory that is renamed into place when complete
(:mod:`echo_trl.io.atomic`); a stopped build leaves no partial cache (its staging directory is removed, or by
the next build once its process is gone). A full disk is one line naming the cache and the space it needs.

The columns hold the *whole* trajectory; cuts (``max_completion_length``) and world-loss targets
are applied later on these tokens (:func:`row_tokens` then ``RoleTokens.truncate``), so one cache
serves every setting.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
from datasets import Features, List, Value
from datasets.table import ConcatenationTable, InMemoryTable, MemoryMappedTable

from ..data.cache_dir import cache_home
from ..data.content import file_digest
from ..data.schema import row_to_trajectory
from ..io.atomic import move_dir_into_place, staging_dir
from ..io.outputs import disk_full_error, is_disk_full
from ..progress import progress_enabled
from .quality import QUALITY_KEYS, rollout_quality, with_dataset_columns
from .size_limit import max_rendered_chars
from .tokenization import RoleTokens, tokenize_rows

__all__ = [
    "add_row_column",
    "tokenize_dataset",
    "row_tokens",
    "tokenizer_fingerprint",
    "map_to_cache",
    "token_cache_dir",
]

#: Bumped whenever the meaning of the cached columns changes (roles, spans), so stale caches are not reused.
LAYOUT_VERSION = "5"

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
#: The source columns a rendering (and the rollout quality) reads, and the one an error names a row by.
SOURCE_COLUMNS = ("prompt", "completion", "tools", "warnings", "format", "group_id")
#: Operations ``datasets`` replays on a memory-mapped table that change no value of the columns kept: which columns
#: are there (their names are keyed), the features' metadata, the chunking.
KEY_NEUTRAL_REPLAYS = ("select", "drop", "replace_schema_metadata", "combine_chunks")
#: Rows tokenized together (one batched encode).
BATCH_ROWS = 64
#: The file that marks a finished cache directory.
DONE = "done.json"


def cache_root() -> Path:
    """Where token caches go (``tokens`` under :func:`cache_home`)."""
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


def _table_key(table) -> list:
    """What decides the content of a ``datasets`` table: per memory-mapped block its file's digest and the
    operations replayed on it (but those of :data:`KEY_NEUTRAL_REPLAYS`), per in-memory block its bytes.
    datasets 5.2's table classes (``datasets.table``)."""
    if isinstance(table, ConcatenationTable):  # blocks without a kept column drop out; one block is keyed as itself
        rows = [[_table_key(block) for block in row if block.num_columns] for row in table.blocks]
        rows = [row[0] if len(row) == 1 else row for row in rows]
        return rows[0] if len(rows) == 1 else rows
    if table.num_columns == 0:
        return [table.num_rows]
    if isinstance(table, MemoryMappedTable):
        replays = [r for r in table.replays if r[0] not in KEY_NEUTRAL_REPLAYS]
        return ["file", file_digest(table.path), repr(replays), table.column_names]
    data = table.table if isinstance(table, InMemoryTable) else table
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    return ["memory", hashlib.sha256(sink.getvalue()).hexdigest()]


def source_key(ds: datasets.Dataset) -> str:
    """The content of the source columns (:data:`SOURCE_COLUMNS`) of the data under ``ds``, every row of it, before
    ``ds``'s own row selection: what a token cache is built from and looked up by."""
    columns = sorted(c for c in SOURCE_COLUMNS if c in ds.data.column_names)
    key = [columns, ds.data.num_rows, _table_key(ds.data.select(columns))]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]


def token_cache_dir(ds: datasets.Dataset, tokenizer) -> Path:
    """The cache directory of ``ds``'s source tokenized with ``tokenizer`` (which may not exist yet). The
    tokenizer's rendered-size bound is part of the key: a row over a tighter bound is refused, as without a cache,
    instead of being read back from a cache built under a looser one."""
    key = f"{source_key(ds)}/{tokenizer_fingerprint(tokenizer)}/{LAYOUT_VERSION}/{max_rendered_chars(tokenizer)}"
    return cache_root() / hashlib.sha256(key.encode()).hexdigest()[:24]


def default_num_proc() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _finished(directory: Path) -> bool:
    return (directory / DONE).is_file()


def _open(directory: Path) -> datasets.Dataset:
    """The cached token columns, memory-mapped (shards in order)."""
    shards = json.loads((directory / DONE).read_text(encoding="utf-8"))["shards"]
    parts = [datasets.Dataset.from_file(str(directory / name)) for name in shards]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _clear_abandoned(root: Path) -> None:
    """Remove the staging directories of builds whose process is gone (killed before they could clean up)."""
    for stale in root.glob(".building-*"):
        try:
            pid = int(stale.name.split("-")[1])  # .building-PID-XXXX
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(stale, ignore_errors=True)
        except (ValueError, IndexError, PermissionError, OSError):
            continue


def _build(source: datasets.Dataset, tokenizer, directory: Path, num_proc: int) -> None:
    """Tokenize every row of ``source`` into ``directory``, whole or not at all."""
    root = directory.parent
    root.mkdir(parents=True, exist_ok=True)
    _clear_abandoned(root)
    with staging_dir(directory, prefix=f".building-{os.getpid()}-") as work:
        source.map(
            _tokenize_rows,
            batched=True,
            batch_size=BATCH_ROWS,
            with_indices=True,
            fn_kwargs={"tokenizer": tokenizer},
            remove_columns=source.column_names,
            features=Features(TOKEN_FEATURES),
            num_proc=num_proc if num_proc > 1 else None,
            cache_file_name=str(work / "tokens.arrow"),
            load_from_cache_file=False,
            new_fingerprint=directory.name,
            desc=f"tokenizing trajectories (once per tokenizer, {num_proc} process{'es' if num_proc > 1 else ''})",
        )
        shards = sorted(p.name for p in work.glob("tokens*.arrow"))
        (work / DONE).write_text(json.dumps({"shards": shards, "rows": len(source)}), encoding="utf-8")
        move_dir_into_place(work, directory, _finished)  # a finished cache another process built wins


def tokenize_dataset(
    ds: datasets.Dataset,
    tokenizer,
    *,
    show_progress: bool | None = None,
    num_proc: int | None = None,
    build: bool = True,
) -> datasets.Dataset | None:
    """``ds`` with :data:`TOKEN_COLUMNS` joined by row: each source row rendered and tokenized exactly once.

    The cache of ``ds``'s source and ``tokenizer`` is built when missing (``num_proc`` processes, default the
    cores available; rows of small sources in one) and read memory-mapped after that, without touching the
    tokenizer; ``build=False`` returns ``None`` instead of building. A row that cannot be rendered is an
    :class:`EchoTrlError` naming its source index and group.
    """
    ds = ds.remove_columns([c for c in TOKEN_COLUMNS if c in ds.column_names])
    directory = token_cache_dir(ds, tokenizer)
    if not _finished(directory):
        if not build:
            return None
        columns = [c for c in SOURCE_COLUMNS if c in ds.data.column_names]
        source = datasets.Dataset(ds.data.select(columns), fingerprint=directory.name)
        procs = max(1, min(num_proc or default_num_proc(), len(source) // (4 * BATCH_ROWS) or 1))
        try:
            with map_progress(show_progress):
                _build(source, tokenizer, directory, procs)
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(directory, source.data.nbytes) from None  # about: the tokens take less
            raise
    return _join(ds, _open(directory))


def _join(ds: datasets.Dataset, tokens: datasets.Dataset) -> datasets.Dataset:
    """``ds`` with the token columns of its source rows: the two tables side by side under ``ds``'s own index
    mapping (no copy of either)."""
    return _side_by_side(ds, tokens.data, tokens.features, tokens._fingerprint)


def _side_by_side(ds: datasets.Dataset, table, features: Features, tag: str) -> datasets.Dataset:
    """``ds`` with ``table``'s columns (one row per row of the data under ``ds``), ``ds``'s row selection and format
    kept (datasets 5.2: a ``Dataset`` over the two tables side by side with ``ds``'s index table)."""
    both = ConcatenationTable.from_tables([ds.data, table], axis=1)
    info = ds.info.copy()
    info.features = Features({**ds.features, **features})
    fingerprint = hashlib.sha256(f"{ds._fingerprint}/{tag}".encode()).hexdigest()[:16]
    out = datasets.Dataset(both, info=info, split=ds.split, indices_table=ds._indices, fingerprint=fingerprint)
    fmt = ds.format
    columns = None if fmt["columns"] is None else [*fmt["columns"], *features]
    out.set_format(fmt["type"], columns=columns, output_all_columns=fmt["output_all_columns"], **fmt["format_kwargs"])
    return out


def add_row_column(ds: datasets.Dataset, name: str, values: list, feature=None) -> datasets.Dataset:
    """``ds.add_column(name, values)`` without its copy of the data when ``ds`` selects rows (``datasets`` flattens
    the selection first: a copy of every column, and a new source for the token cache). Each value is placed at
    its row's source index, other source rows get null; a selection that repeats a row is flattened as before."""
    indices = None if ds._indices is None else ds._indices.column(0).to_numpy()
    if indices is not None and len(np.unique(indices)) != len(indices):
        return ds.add_column(name, values, feature=feature)
    if feature is None:
        array = pa.array(values)
        feature = Features.from_arrow_schema(pa.schema([(name, array.type)]))[name]
    else:
        array = pa.array(values, type=Features({name: feature}).arrow_schema.field(name).type)
    full = array
    if indices is not None:
        order = np.full(ds.data.num_rows, len(values), dtype=np.int64)
        order[indices] = np.arange(len(values))
        full = pa.concat_arrays([array, pa.nulls(1, type=array.type)]).take(pa.array(order))
    column = InMemoryTable(pa.table({name: full}))
    # The values' own bytes as their tag (datasets' add_column pickles the list to fingerprint it: seconds at 100k).
    digest = hashlib.sha256()
    for buffer in full.buffers():
        digest.update(b"-" if buffer is None else buffer)
    return _side_by_side(ds, column, Features({name: feature}), f"{name}/{full.type}/{len(full)}/{digest.hexdigest()}")


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
    """``datasets``' progress bars (a count, a rate and an ETA) inside the block as
    :func:`~echo_trl.progress.progress_enabled` says (``show``, else ``ECHO_TRL_PROGRESS``, else whether stderr is
    a terminal), put back as they were afterwards: the commands turn datasets' bars off for short work
    (``quiet_short_work``), and a token-cache build is long work."""
    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    if progress_enabled(show):
        datasets.enable_progress_bars()
    else:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
        else:
            datasets.disable_progress_bars()


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
