"""Find episode files and read their raw records: the file layer under :mod:`echo_trl.data.readers.awm`.

Files may be ``.json`` (one object or a list of objects) or ``.jsonl`` (one object per line),
suffixes in any case; directories are searched recursively, in sorted order, so the same
input always gives the same records in the same order. Nothing here raises for one bad
record or one unreadable part: each becomes a record carrying its :class:`EpisodeError`, so a
lenient build names it and keeps everything else, and a strict one stops at it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import EpisodeError

EPISODE_SUFFIXES = (".json", ".jsonl")


@dataclass(frozen=True)
class EpisodeRecord:
    """One raw record read from disk, with where it came from; ``error`` set if unreadable."""

    source: str
    record: str  # "17" for a JSONL line, "[3]" for a list index, "" for a whole-file object
    data: Any = None
    error: EpisodeError | None = None
    raw: str | None = None  # the raw text of the record, kept for the skipped report


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf: a number no float can hold, not infinity
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_json(text: str) -> Any:
    """Strict JSON: duplicated keys, NaN/Infinity and overflowing numbers are errors.

    Raises ``ValueError`` (also for integers longer than Python's digit limit) or
    ``RecursionError`` (nesting deeper than the interpreter's recursion limit).
    """
    return json.loads(
        text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant, parse_float=_finite_float
    )


#: Files echo-trl writes beside episodes that are not episodes: the skipped report, capture's state and summary, and
#: the scenario check's results, state and report (``capture --check`` writes them into the capture's output).
OWN_REPORTS = (
    "skipped.jsonl",
    "capture_state.json",
    "capture_summary.json",
    "scenario_check.jsonl",
    "scenario_check_state.json",
    "scenario_report.json",
)


def is_episode_file(path: Path) -> bool:
    """An episode file by its suffix, in any case (``.JSON`` from some exporters), never our own report."""
    return path.suffix.lower() in EPISODE_SUFFIXES and path.name not in OWN_REPORTS and not _collect_metadata(path)


def _collect_metadata(path: Path) -> bool:
    """``openenv collect``'s run metadata (beside its ``results.jsonl``): not an episode."""
    return path.name == "metadata.json" and (path.parent / "results.jsonl").is_file()


def _walk_input(path: Path) -> tuple[list[Path], list[EpisodeError]]:
    """Episode files under one input and the parts that could not be searched, each named.

    ``Path.rglob`` silently skips directories it cannot list; ``os.walk`` reports them.
    """
    if path.is_file():
        return [path], []
    if not path.is_dir():
        return [], [EpisodeError("no such file or directory", source=str(path))]
    files: list[Path] = []
    problems: list[EpisodeError] = []

    def unreadable(exc: OSError) -> None:
        problems.append(
            EpisodeError(f"cannot read directory: {exc.strerror or exc}", source=str(exc.filename or path))
        )

    for root, _dirs, names in os.walk(path, onerror=unreadable):
        for name in names:
            file = Path(root, name)
            if not is_episode_file(file):
                continue
            if file.is_file():
                files.append(file)
            else:  # a dangling link or a FIFO named *.json: say so rather than skip it
                problems.append(EpisodeError("not a regular file (a dangling link?)", source=str(file)))
    files.sort()
    if not files and not problems:
        problems.append(
            EpisodeError(f"no episode files ({', '.join(EPISODE_SUFFIXES)}) in this directory", source=str(path))
        )
    return files, problems


def find_episode_files(inputs: Iterable[str | Path], problems: list[EpisodeError] | None = None) -> list[Path]:
    """Expand files and directories into a sorted, de-duplicated list of episode files.

    Inputs that cannot be searched (missing, unreadable subdirectories, directories without
    episode files) raise :class:`EpisodeError`, or are appended to ``problems`` when given.
    """
    files: list[Path] = []
    for item in inputs:
        found, errors = _walk_input(Path(item))
        if errors and problems is None:
            raise errors[0]
        files.extend(found)
        if problems is not None:
            problems.extend(errors)
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


def iter_episode_records(inputs: Iterable[str | Path]) -> Iterator[EpisodeRecord]:
    """Yield every raw record of every input; unreadable records carry an ``error``, never raise.

    A broken line in a JSONL file does not hide the valid lines around it; an input or
    subdirectory that cannot be searched is a record with an error, never silently nothing.
    """
    problems: list[EpisodeError] = []
    files = find_episode_files(inputs, problems)
    for problem in problems:
        yield EpisodeRecord(problem.source, "", error=problem)
    yield from iter_file_records(files)


def iter_file_records(files: Iterable[Path]) -> Iterator[EpisodeRecord]:
    """Every raw record of episode files already found, in order. A JSONL file is read a line at a time (memory
    bounded by its longest line, whatever its size); a JSON file whole."""
    for path in files:
        source = str(path)
        if path.suffix.lower() == ".jsonl":
            yield from _jsonl_records(path, source)
            continue
        try:
            data = path.read_bytes()
        except OSError as exc:
            yield _unreadable(source, exc)
            continue
        rec = _parse_record(data, source, "")
        if rec.error is None and isinstance(rec.data, list):
            for i, item in enumerate(rec.data):
                yield EpisodeRecord(source, f"[{i}]", data=item, raw=None)
        else:
            yield rec


def _unreadable(source: str, exc: OSError) -> EpisodeRecord:
    return EpisodeRecord(source, "", error=EpisodeError(f"cannot read file: {exc.strerror or exc}", source=source))


def _jsonl_records(path: Path, source: str) -> Iterator[EpisodeRecord]:
    """The records of one JSONL file, streamed; lines split at ``\\n`` only (a ``\\r`` stays in its line)."""
    try:
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, start=1):
                line = line.removesuffix(b"\n")
                if line.strip():
                    yield _parse_record(line, source, str(lineno))
    except OSError as exc:
        yield _unreadable(source, exc)


def _parse_record(raw: bytes, source: str, record: str) -> EpisodeRecord:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        err = EpisodeError(f"invalid UTF-8 at byte {exc.start}", source=source, record=record or None)
        return EpisodeRecord(source, record, error=err, raw=raw.decode("utf-8", errors="replace"))
    try:
        return EpisodeRecord(source, record, data=parse_json(text), raw=text)
    except (ValueError, RecursionError) as exc:
        err = EpisodeError(f"invalid JSON: {exc}", source=source, record=record or None)
        return EpisodeRecord(source, record, error=err, raw=text)
