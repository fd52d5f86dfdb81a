"""echo_trl.progress: bars only where someone watches; scripts that print one table silence the libraries."""

from __future__ import annotations

import logging
import os
import warnings

import pytest

from echo_trl.progress import progress, quiet_libraries


def test_progress_is_silent_off_a_terminal_and_yields_everything(capsys):
    assert list(progress(range(5), desc="work")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("keep", [False, True])
def test_quiet_libraries_drops_deprecations_and_keeps_what_is_asked(monkeypatch, keep):
    monkeypatch.delenv("ECHO_TRL_PROGRESS", raising=False)
    logger = logging.getLogger("echo_trl")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_libraries(progress_bars=keep, user_warnings=keep)
        warnings.warn("old", FutureWarning, stacklevel=1)
        warnings.warn("heads up", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == (["heads up"] if keep else [])
    assert logger.level == logging.ERROR
    assert (os.environ.get("ECHO_TRL_PROGRESS") == "0") is not keep
