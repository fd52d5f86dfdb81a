"""Build the trajectory dataset: recorded episodes or trajectories -> ``datasets.Dataset`` of :data:`FEATURES`.

Streaming, so memory stays flat in the number of episodes: records are read (a JSONL file a line at a
time), converted, encoded and written to Arrow :data:`BATCH_ROWS` rows at a time, and the dataset card is
counted from those batches (:class:`~echo_trl.data.card.CardCounts`); no list of trajectories or rows is
ever kept. :func:`write_awm_dataset` writes a ``save_to_disk`` directory directly (one Arrow shard per
process, ``num_proc`` processes over contiguous runs of the input files, so rows keep their order);
:func:`build_awm_dataset` gives the same rows as an in-memory dataset (its Arrow data only).

Every row is encoded on its own (:func:`echo_trl.data.schema.encode_row`) inside its record's error
handling, so a value the schema cannot store names its record and column, and a lenient build skips
that record instead of failing on the whole input. Processes keep the sequential errors: a strict build
raises the error of the first bad record in input order, a lenient one lists skipped records in that order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, wait
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import datasets
import pyarrow as pa
from datasets.arrow_writer import ArrowWriter

from ..errors import EpisodeError
from ..progress import progress, progress_bar
from ..roles import Trajectory
from .card import CardCounts
from .readers.episode_files import find_episode_files, iter_file_records
from .readers.formats import FORMATS
from .readers.prompt import DEFAULT_SYSTEM_PROMPT
from .readers.records import SkippedRecord, iter_awm_trajectories, no_valid_episodes
from .schema import ARROW_SCHEMA, FEATURES, encode_row

__all__ = ["BuildResult", "build_awm_dataset", "trajectories_to_dataset", "write_awm_dataset"]

#: Rows encoded, counted and written together: what a build holds in memory at once (~8 MB of AWM episodes).
BATCH_ROWS = 256
#: Inputs smaller than this are built in this process whatever ``num_proc`` says (a process start costs more).
PARALLEL_MIN_BYTES = 32 << 20


def available_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _batches(rows: Iterable[pa.RecordBatch], size: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """One-row batches joined ``size`` at a time (one Arrow batch each: no per-row chunks downstream)."""
    buffer: list[pa.RecordBatch] = []
    for row in rows:
        buffer.append(row)
        if len(buffer) == size:
            yield pa.concat_batches(buffer)
            buffer = []
    if buffer:
        yield pa.concat_batches(buffer)


def trajectories_to_dataset(trajectories: Iterable[Trajectory], format: str = "chat-template") -> datasets.Dataset:
    """A dataset with the explicit ECHO schema (never inferred, so every build has one schema).

    Raises :class:`EpisodeError` naming the row (``row N``) and column a value cannot be stored in.
    """

    def rows() -> Iterator[pa.RecordBatch]:
        for i, trajectory in enumerate(trajectories):
            try:
                yield encode_row(trajectory, format)
            except EpisodeError as exc:
                raise exc.at(source="trajectories", record=f"row {i}") from None

    return _in_memory(_batches(rows()))


def _in_memory(batches: Iterable[pa.RecordBatch]) -> datasets.Dataset:
    table = pa.Table.from_batches(list(batches), schema=ARROW_SCHEMA)
    return datasets.Dataset(table, info=datasets.DatasetInfo(features=FEATURES))


@dataclass(frozen=True)
class _Options:
    """How records become rows (the same in every process)."""

    strict: bool = True
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    compact_tools: bool = False
    format: str | None = None  # None: each episode's own (the one it was captured in)
    verify_turn: str | None = None

    def rows(self, records, on_skip: Callable[[SkippedRecord], None] | None) -> Iterator[pa.RecordBatch]:
        """Each valid record's one-row Arrow batch (encoded inside its record's error handling)."""
        converted = iter_awm_trajectories(
            records,
            strict=self.strict,
            on_skip=on_skip,
            check=encode_row,
            system_prompt=self.system_prompt,
            compact_tools=self.compact_tools,
            format=self.format,
            verify_turn=self.verify_turn,
        )
        return (row for _, row in converted)


def _check_format(format: str | None) -> None:
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})")


def build_awm_dataset(
    inputs: Iterable[str | Path],
    *,
    strict: bool = True,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    skipped: list[SkippedRecord] | None = None,
    show_progress: bool | None = None,
    compact_tools: bool = False,
    format: str | None = None,
    verify_turn: str | None = None,
) -> datasets.Dataset:
    """Build the trajectory dataset from AWM episode files and directories, in memory (its Arrow data only;
    :func:`write_awm_dataset` writes it to disk in bounded memory).

    Deterministic: inputs are read in sorted order and rows keep that order. With
    ``strict=False`` invalid records are appended to ``skipped`` (when given) instead of raising,
    and every valid record is kept. ``compact_tools`` drops the response documentation fastapi-mcp
    appends to tool descriptions (much shorter prompts; :func:`echo_trl.data.readers.tools.compact_tool_schema`).

    ``format``: ``chat-template`` (tool calls and schemas for the model's chat template) or
    ``awm-agent`` (the official AWM agent's conversation: its system prompt, ``list_tools`` /
    ``call_tool``; see ``docs/datasets.md``); ``None`` (the default): each episode in the format it was
    captured in (``metadata.format``), ``chat-template`` where it records none. Recorded in the ``format``
    column.
    ``verify_turn``: ``env_output`` or ``omit`` the verifier step (default: ``env_output`` for
    chat-template, ``omit`` for awm-agent). Conversation logs (``messages`` + ``reward``) are
    taken as recorded in either format.
    """
    _check_format(format)
    from .readers.episode_files import iter_episode_records

    inputs = list(inputs)
    rejected: list[SkippedRecord] = []
    options = _Options(strict, system_prompt, compact_tools, format, verify_turn)
    records = progress(iter_episode_records(inputs), desc="episodes", unit="ep", enable=show_progress)
    batches = list(_batches(options.rows(records, rejected.append)))
    if skipped is not None:
        skipped.extend(rejected)
    if not batches:
        raise no_valid_episodes(inputs, len(rejected), rejected[0].reason if rejected else None)
    return _in_memory(batches)


@dataclass
class BuildResult:
    """What :func:`write_awm_dataset` wrote: the card's counts and the records it skipped (written to
    ``skipped``; the first :data:`KEPT_REASONS` reasons kept for a summary)."""

    counts: CardCounts
    skipped: int = 0
    reasons: list[str] = field(default_factory=list)


KEPT_REASONS = 10


@dataclass
class _Part:
    """One process's share of a build: its rows, counts, skipped records, or the error that stopped it."""

    path: str
    counts: CardCounts
    skipped: int = 0
    reasons: list[str] = field(default_factory=list)
    error: tuple[str, str, str | None, str | None] | None = None  # EpisodeError fields: message, source, record, field


#: In a worker process of a parallel build: the input bytes read so far by all workers (:func:`_worker_init`).
_bytes_read = None


def _worker_init(counter) -> None:
    global _bytes_read
    _bytes_read = counter


def _count_shared(n: int) -> None:
    with _bytes_read.get_lock():
        _bytes_read.value += n


def _counted(files: list[str], count: Callable[[int], None] | None) -> Iterator[Path]:
    """``files`` as paths; each one's size is passed to ``count`` once it has been read whole (the reader asks for
    the next one, or stops): the progress of a build in input bytes."""
    for name in files:
        path = Path(name)
        yield path
        if count is not None:
            with suppress(OSError):  # an unreadable file is a skipped record, reported elsewhere
                count(path.stat().st_size)


def _write_part(
    files: list[str], path: str, skipped_path: str, options: _Options, count: Callable[[int], None] | None = None
) -> _Part:
    """Write the rows of ``files`` to the Arrow file ``path`` (skipped records to ``skipped_path``), streaming;
    the bytes of each file read go to ``count`` (in a worker process: to the shared count of the build)."""
    if count is None and _bytes_read is not None:
        count = _count_shared
    part = _Part(path, CardCounts())

    with open(skipped_path, "w", encoding="utf-8") as skipped_file:

        def skip(record: SkippedRecord) -> None:
            part.skipped += 1
            if len(part.reasons) < KEPT_REASONS:
                part.reasons.append(record.reason)
            skipped_file.write(record.to_jsonl() + "\n")

        writer = ArrowWriter(features=FEATURES, path=path, writer_batch_size=BATCH_ROWS)
        try:
            for batch in _batches(options.rows(iter_file_records(_counted(files, count)), skip)):
                writer.write_table(pa.Table.from_batches([batch]))
                part.counts.add(batch)
        except EpisodeError as exc:
            part.error = (exc.message, exc.source, exc.record, exc.field)
        finally:
            writer.finalize()
    return part


def _split(files: list[Path], parts: int) -> list[list[Path]]:
    """Contiguous runs of ``files`` of about equal size (order kept)."""
    sizes = [f.stat().st_size if f.is_file() else 0 for f in files]
    total, runs, run, done = sum(sizes) or 1, [], [], 0
    for f, size in zip(files, sizes, strict=True):
        run.append(f)
        done += size
        if len(runs) < parts - 1 and done >= total * (len(runs) + 1) / parts:
            runs.append(run)
            run = []
    return [*runs, run] if run else runs


def write_awm_dataset(
    inputs: Iterable[str | Path],
    directory: str | Path,
    *,
    num_proc: int | None = None,
    strict: bool = True,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    skipped_file: str | Path | None = None,
    compact_tools: bool = False,
    format: str | None = None,
    verify_turn: str | None = None,
    show_progress: bool | None = None,
) -> BuildResult:
    """:func:`build_awm_dataset` written as a ``save_to_disk`` directory into the empty ``directory`` (the caller
    makes it appear atomically), in memory bounded by :data:`BATCH_ROWS` rows per process, whatever the input's
    size. ``num_proc`` processes (default: the cores available; one for inputs under
    :data:`PARALLEL_MIN_BYTES`) take contiguous runs of the input files, one Arrow shard each, so the rows
    keep the sequential order. Skipped records are written to ``skipped_file`` (JSONL) when given.
    """
    _check_format(format)
    inputs = list(inputs)
    options = _Options(strict, system_prompt, compact_tools, format, verify_turn)
    directory = Path(directory)
    problems: list[EpisodeError] = []
    files = find_episode_files(inputs, problems)
    if problems and strict:
        raise problems[0]
    size = sum(f.stat().st_size for f in files if f.is_file())
    wanted = num_proc or available_cores()
    runs = _split(files, 1 if size < PARALLEL_MIN_BYTES else max(1, min(wanted, len(files))))
    with tempfile.TemporaryDirectory(dir=directory, prefix=".parts-") as work:
        jobs = [
            ([str(f) for f in run], os.path.join(work, f"part-{k}.arrow"), os.path.join(work, f"skipped-{k}.jsonl"))
            for k, run in enumerate(runs)
        ]
        parts = _run_parts(jobs, options, size, show_progress)
        result = BuildResult(CardCounts())
        _problems_first(problems, result, skipped_file)
        for part in parts:
            if part.error is not None:
                message, source, record, where = part.error
                raise EpisodeError(message, source=source, record=record, field=where)
            result.counts.merge(part.counts)
            result.skipped += part.skipped
            result.reasons += part.reasons[: KEPT_REASONS - len(result.reasons)]
        if skipped_file is not None:
            with open(skipped_file, "ab") as out:
                for _, _, skipped_path in jobs:
                    with open(skipped_path, "rb") as part_file:
                        shutil.copyfileobj(part_file, out)
        if not result.counts.rows:
            raise no_valid_episodes(inputs, result.skipped, result.reasons[0] if result.reasons else None)
        _finish_layout(directory, [p.path for p in parts if p.counts.rows])
    return result


def _problems_first(problems: list[EpisodeError], result: BuildResult, skipped_file) -> None:
    """Inputs that could not be searched come first in a lenient build's skipped records (as they are read first)."""
    for problem in problems:
        record = SkippedRecord(problem.source, "", str(problem), None)
        result.skipped += 1
        if len(result.reasons) < KEPT_REASONS:
            result.reasons.append(record.reason)
        if skipped_file is not None:
            with open(skipped_file, "a", encoding="utf-8") as out:
                out.write(record.to_jsonl() + "\n")
    if skipped_file is not None and not problems:
        Path(skipped_file).write_text("", encoding="utf-8")


def _run_parts(
    jobs: list[tuple[list[str], str, str]], options: _Options, size: int, show_progress: bool | None
) -> list[_Part]:
    """Each job's part, in order: in this process for one job, else one process each; a strict build stops at the
    first part (in input order) that failed and never waits for the parts after it. A bar counts the input bytes
    read (``size`` in all), file by file, with an ETA (:mod:`echo_trl.progress`: a terminal's, unless asked)."""
    with progress_bar(size, desc="build-dataset (input read)", unit="B", unit_scale=True, enable=show_progress) as bar:
        if len(jobs) <= 1:  # none: no episode file was found (a lenient build reports why)
            return [_write_part(*job, options, bar.update) for job in jobs]
        parts: list[_Part] = []
        context = _context()
        counter = context.Value("q", 0)
        with ProcessPoolExecutor(len(jobs), mp_context=context, initializer=_worker_init, initargs=(counter,)) as pool:
            futures = [pool.submit(_write_part, *job, options) for job in jobs]
            for future in futures:
                while not wait([future], timeout=0.5).done:
                    bar.update(counter.value - bar.n)
                part = future.result()
                bar.update(counter.value - bar.n)
                parts.append(part)
                if part.error is not None:
                    for later in futures:
                        later.cancel()
                    break
        return parts


def _context():
    """``fork`` where it is safe and cheap (Linux, no torch thread pools in this process: the command never imports
    torch), else ``spawn`` (every process imports echo_trl again, a second or two)."""
    import sys

    fork = sys.platform == "linux" and "torch" not in sys.modules
    return get_context("fork" if fork else "spawn")


def _finish_layout(directory: Path, shards: list[str]) -> None:
    """Move the shards into ``directory`` under ``save_to_disk``'s names and write its ``state.json`` and
    ``dataset_info.json``: those of an empty dataset of :data:`FEATURES` saved by ``datasets`` itself, with
    this dataset's data files and a fingerprint of their bytes (so ``load_from_disk`` reads the directory as
    one it wrote)."""
    with tempfile.TemporaryDirectory(dir=directory, prefix=".layout-") as scratch:
        shown = datasets.utils.logging.is_progress_bar_enabled()
        datasets.disable_progress_bars()
        try:
            _in_memory([]).save_to_disk(scratch)
        finally:
            if shown:
                datasets.enable_progress_bars()
        state = json.loads(Path(scratch, "state.json").read_text(encoding="utf-8"))
        info = Path(scratch, "dataset_info.json").read_text(encoding="utf-8")
    digest = hashlib.sha256()
    names = [f"data-{k:05d}-of-{len(shards):05d}.arrow" for k in range(len(shards))]
    for shard, name in zip(shards, names, strict=True):
        with open(shard, "rb") as fh:
            digest.update(hashlib.file_digest(fh, "sha256").digest())
        os.replace(shard, directory / name)
    state.update(_data_files=[{"filename": name} for name in names], _fingerprint=digest.hexdigest()[:16])
    (directory / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
    (directory / "dataset_info.json").write_text(info, encoding="utf-8")
