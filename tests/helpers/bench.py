"""The benchmark scripts, importable by their module names as they import each other: ``benchmarks/`` (its
``common.py``) and each of its folders on ``sys.path``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def importable_benchmarks() -> Path:
    """Put ``benchmarks/`` and its folders on ``sys.path`` (once); returns ``benchmarks/``."""
    for folder in [BENCH, *sorted(p for p in BENCH.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))]:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    return BENCH
