"""Where echo_trl keeps what it can always recompute: ``$ECHO_TRL_CACHE``, default ``~/.cache/echo_trl``.

Beneath it: ``digests/`` (content hashes of Arrow files, :mod:`echo_trl.data.content`), ``tokens/`` (token
caches of datasets with no writable directory of their own, :mod:`echo_trl.tokens.cache`) and the demo's tiny
models. Here, at the bottom of the stages, so that every stage that caches reads the same root.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_home"]


def cache_home() -> Path:
    """echo_trl's cache directory: ``$ECHO_TRL_CACHE``, default ``~/.cache/echo_trl``."""
    return Path(os.environ.get("ECHO_TRL_CACHE", Path.home() / ".cache" / "echo_trl"))
