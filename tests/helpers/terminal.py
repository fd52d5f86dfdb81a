"""Progress bars are shown on a terminal only (echo_trl.progress): tests pretend stderr is one, in process."""

from __future__ import annotations

import sys


def pretend_terminal(monkeypatch, terminal: bool = True) -> None:
    """stderr (pytest's capture, under ``capsys``) answers ``isatty()`` with ``terminal``, and ``ECHO_TRL_PROGRESS``
    (which conftest sets to 0 for the whole run, and which wins over the terminal check) is unset: bars appear exactly
    where a user at a terminal would see them, and nowhere for a pipe."""
    monkeypatch.delenv("ECHO_TRL_PROGRESS", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
