"""Progress bars for long work: shown on a terminal, silent in logs and tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], *, desc: str, unit: str = "it", total: int | None = None,
             enable: bool | None = None) -> Iterator[T]:
    """``tqdm`` on stderr when it is a terminal (or ``enable=True``); ``ECHO_TRL_PROGRESS=0`` silences it."""
    if enable is None:
        enable = sys.stderr.isatty() and os.environ.get("ECHO_TRL_PROGRESS", "1") != "0"
    return iter(tqdm(items, desc=desc, unit=unit, total=total, disable=not enable, file=sys.stderr))
