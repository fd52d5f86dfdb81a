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


def quiet_libraries(*, progress_bars: bool = False, user_warnings: bool = False) -> None:
    """For commands and scripts whose output is one table: TRL / transformers / datasets chatter off.

    Deprecation notices (FutureWarning), library logging below ERROR and their progress bars always go;
    ``progress_bars=True`` keeps echo_trl's own bars, ``user_warnings=True`` keeps ``UserWarning``s.
    """
    import logging
    import warnings

    import datasets
    import transformers

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if not progress_bars:
        os.environ.setdefault("ECHO_TRL_PROGRESS", "0")
    warnings.filterwarnings("ignore", category=FutureWarning)
    if not user_warnings:
        warnings.filterwarnings("ignore", category=UserWarning)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    logging.getLogger("echo_trl").setLevel(logging.ERROR)
