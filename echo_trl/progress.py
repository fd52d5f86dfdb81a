"""Progress bars for long work: shown on a terminal, silent in logs and tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(
    items: Iterable[T], *, desc: str, unit: str = "it", total: int | None = None, enable: bool | None = None
) -> Iterator[T]:
    """``tqdm`` on stderr when it is a terminal (or ``enable=True``); ``ECHO_TRL_PROGRESS=0`` silences it."""
    if enable is None:
        enable = sys.stderr.isatty() and os.environ.get("ECHO_TRL_PROGRESS", "1") != "0"
    return iter(tqdm(items, desc=desc, unit=unit, total=total, disable=not enable, file=sys.stderr))


def quiet_short_work() -> None:
    """Library progress bars for work that takes a blink off: datasets' save / map / filter bars, transformers'
    weight loading and shard writing. Hub download bars (long work) stay, and so does training progress."""
    import datasets
    import huggingface_hub.utils
    import transformers

    datasets.disable_progress_bars()
    downloads = not huggingface_hub.utils.are_progress_bars_disabled()
    transformers.utils.logging.disable_progress_bar()  # also turns off huggingface_hub's bars ...
    if downloads:
        huggingface_hub.utils.enable_progress_bars()  # ... which show downloads: long work, keep them


def quiet_libraries(*, progress_bars: bool = False, user_warnings: bool = False) -> None:
    """For commands and scripts whose output is one table: TRL / transformers / datasets chatter off.

    Deprecation notices (FutureWarning), library logging below ERROR and their progress bars always go;
    ``progress_bars=True`` keeps echo_trl's own bars, ``user_warnings=True`` keeps ``UserWarning``s.
    """
    import logging
    import warnings

    import transformers

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if not progress_bars:
        os.environ.setdefault("ECHO_TRL_PROGRESS", "0")
    warnings.filterwarnings("ignore", category=FutureWarning)
    if not user_warnings:
        warnings.filterwarnings("ignore", category=UserWarning)
    transformers.logging.set_verbosity_error()
    quiet_short_work()
    logging.getLogger("echo_trl").setLevel(logging.ERROR)
