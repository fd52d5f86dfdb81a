"""Progress bars for long work: shown on a terminal, silent in logs and tests.

The conventions every long job of echo_trl follows (capture, build-dataset, the token cache, stats, evaluation,
the demo's phases):

- a bar on stderr with a count, a rate and an ETA (tqdm's) when the number of items is known;
- shown when stderr is a terminal; ``ECHO_TRL_PROGRESS=1`` shows it anyway (a log file then holds tqdm's
  updates), ``ECHO_TRL_PROGRESS=0`` hides it; a caller's explicit ``enable=`` wins over both;
- stdout is never written (``--json`` output stays one object).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress_enabled(enable: bool | None = None) -> bool:
    """Whether a bar is shown: ``enable`` when given, else ``ECHO_TRL_PROGRESS`` (``1`` / ``0``) when set, else
    whether stderr is a terminal."""
    if enable is not None:
        return enable
    setting = os.environ.get("ECHO_TRL_PROGRESS", "")
    if setting in ("0", "1"):
        return setting == "1"
    return sys.stderr.isatty()


def progress(
    items: Iterable[T], *, desc: str, unit: str = "it", total: int | None = None, enable: bool | None = None
) -> Iterator[T]:
    """``items`` through a ``tqdm`` bar on stderr, shown as :func:`progress_enabled` says."""
    return iter(tqdm(items, desc=desc, unit=unit, total=total, disable=not progress_enabled(enable), file=sys.stderr))


def progress_bar(
    total: int | None, *, desc: str, unit: str = "it", unit_scale: bool = False, enable: bool | None = None
) -> Any:
    """A bar to ``update(n)`` by hand (a ``tqdm``; use it as a context manager), shown as :func:`progress_enabled`
    says: for work that is not a loop over items (optimizer steps reported by a callback, bytes read).
    ``unit_scale``: counts shown as 1.2M (bytes: ``unit="B"``)."""
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit_scale,
        unit_divisor=1024 if unit == "B" else 1000,
        disable=not progress_enabled(enable),
        file=sys.stderr,
    )


def training_progress(desc: str, *, enable: bool | None = None) -> Any:
    """A ``transformers.TrainerCallback`` drawing one bar over a run's optimizer steps (``max_steps``), with the
    evaluations in its postfix: for runs whose own tqdm is off because it prints every log dictionary (the demo,
    the comparison scripts). transformers loads when this is called, not when the module is imported."""
    from transformers import TrainerCallback

    class StepBar(TrainerCallback):
        def __init__(self) -> None:
            self.bar = None

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                self.bar = progress_bar(state.max_steps, desc=desc, unit="step", enable=enable)
                self.bar.update(state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            if self.bar is not None and metrics:
                shown = {k.rsplit("/", 1)[-1]: v for k, v in metrics.items() if k.endswith("ce_env")}
                self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()}, refresh=True)

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    return StepBar()


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
