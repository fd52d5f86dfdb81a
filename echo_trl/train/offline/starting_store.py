"""An append-only file of starting-model log-probs, one record per row, written as training first uses each row.

Why a file of records and not a ``datasets`` column: the column needs every row's values before it can be
written, a pass over the whole dataset before step 1 (hours at 100k episodes). Here each batch's new rows are
appended (and flushed) as soon as they are computed, so a run killed after an hour keeps what it computed, and a
resumed run (or a later run with the same starting model, data and settings) reads them instead of forwarding.

A record is ``row`` (int64), ``n`` (int64), then ``n`` float32 values. A record cut short by a kill is ignored
when read (and overwritten by the next append). Only an index ``row -> (file, offset, n)`` is held in memory
(tens of bytes a row); values are read from disk when a batch needs them. Each process appends to its own file
(``rank-<i>.bin``) and reads every process's, so a resume with another number of processes reuses them all.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["StartingStore"]

_HEADER = np.dtype([("row", "<i8"), ("n", "<i8")])


class StartingStore:
    """The records under ``directory`` (one directory per fingerprint of starting model, data and settings)."""

    def __init__(self, directory: str | os.PathLike, rank: int = 0):
        self.directory, self.rank = Path(directory), rank
        self.index: dict[int, tuple[Path, int, int]] = {}
        self._own = self.directory / f"rank-{rank}.bin"
        self._own_end = 0  # where this process's next record goes (after the last complete one)
        self.read(self.directory)

    def read(self, directory: str | os.PathLike) -> None:
        """Index every complete record of the ``rank-*.bin`` files under ``directory`` (rows already indexed keep
        their first record: every record of a row holds the same values)."""
        for path in sorted(Path(directory).glob("rank-*.bin")):
            end = self._scan(path)
            if path == self._own:
                self._own_end = end

    def _scan(self, path: Path) -> int:
        size, offset = path.stat().st_size, 0
        with open(path, "rb") as fh:
            while offset + _HEADER.itemsize <= size:
                fh.seek(offset)
                header = np.frombuffer(fh.read(_HEADER.itemsize), dtype=_HEADER)[0]
                row, n = int(header["row"]), int(header["n"])
                end = offset + _HEADER.itemsize + 4 * n
                if n < 0 or end > size:
                    break  # cut short by a kill: ignored, overwritten by the next append
                self.index.setdefault(row, (path, offset + _HEADER.itemsize, n))
                offset = end
        return offset

    def __contains__(self, row: int) -> bool:
        return row in self.index

    def get(self, row: int) -> list[float]:
        path, offset, n = self.index[row]
        with open(path, "rb") as fh:
            fh.seek(offset)
            return np.frombuffer(fh.read(4 * n), dtype="<f4").tolist()

    def append(self, values: dict[int, list[float]]) -> None:
        """Write ``values`` (row -> float32 values) after this process's last complete record, flushed."""
        if not values:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        mode = "r+b" if self._own.exists() else "wb"
        with open(self._own, mode) as fh:
            fh.seek(self._own_end)
            for row, vals in values.items():
                array = np.asarray(vals, dtype="<f4")
                fh.write(np.array([(row, array.size)], dtype=_HEADER).tobytes())
                self.index.setdefault(row, (self._own, fh.tell(), array.size))
                fh.write(array.tobytes())
            fh.truncate()
            self._own_end = fh.tell()
