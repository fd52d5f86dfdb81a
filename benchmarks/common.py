"""Shared benchmark plumbing: flags, A/B timing with medians, a table and one JSON line."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes: a CPU run of at most ~2 minutes")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object with the results")
    p.add_argument("--output", type=Path, default=None, help="also write the JSON results to this file")
    return p


def alternate(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Run each variant ``repeats`` times, interleaved (A B A B ...), so drift hits both alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def report(rows: list[tuple[str, ...]], header: tuple[str, ...], results: dict, args) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)))
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))
    if args.json:
        print(json.dumps(results))
