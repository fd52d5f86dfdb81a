"""Many distinct, valid AWM episodes from the bundled ones, for the scale benchmark (``scale.py``).

The 60 bundled episodes (one scenario, 10 tasks x 6, ~31 KB each) are replicated: replica ``r`` of the set gets
the scenario ``<scenario>_r<r>`` (so 60 episodes per scenario, as a GRPO group of 6 over AWM's 10 tasks: 1k
episodes are 17 scenarios, 100k are 1,667) and a marker of ``r`` in its task and every tool result, so no two
episodes are byte-identical and each scenario's tool preamble is shared only inside the scenario, as in AWM-1K.
Episodes are written as JSONL files of ``per_file`` episodes each (the capture's layout), streamed.

    python benchmarks/data_scale/scale_episodes.py N OUT_DIR
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

BUNDLED = Path(__file__).resolve().parents[2] / "data" / "episodes"


def bundled() -> list[dict]:
    """The bundled episodes, in file order."""
    out = []
    for path in sorted(BUNDLED.glob("*.jsonl")):
        out += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return out


def episodes(n: int) -> Iterator[dict]:
    """``n`` distinct valid episodes (see the module docstring), one at a time."""
    base = bundled()
    for i in range(n):
        replica, k = divmod(i, len(base))
        ep = json.loads(json.dumps(base[k]))
        ep["scenario"] = f"{ep['scenario']}_r{replica}"
        ep["task"] = f"{ep['task']} (request {replica}-{k})"
        for step in ep["steps"]:
            obs = step.get("observation") or {}
            if isinstance(obs.get("tool_result"), str):
                obs["tool_result"] += f"\n(served for request {replica}-{k})"
        yield ep


def write_episodes(n: int, out: Path, per_file: int = 500) -> int:
    """Write ``n`` episodes under ``out`` (created); returns the bytes written."""
    out.mkdir(parents=True, exist_ok=True)
    written, fh = 0, None
    for i, ep in enumerate(episodes(n)):
        if i % per_file == 0:
            if fh is not None:
                fh.close()
            fh = (out / f"episodes_{i // per_file:05d}.jsonl").open("w", encoding="utf-8")
        line = json.dumps(ep) + "\n"
        fh.write(line)
        written += len(line.encode())
    if fh is not None:
        fh.close()
    return written


if __name__ == "__main__":
    size = write_episodes(int(sys.argv[1]), Path(sys.argv[2]))
    print(f"{sys.argv[1]} episodes, {size / 1e6:.1f} MB -> {sys.argv[2]}")
