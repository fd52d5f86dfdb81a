"""What the sandbox around generated code costs: scenario-server start, MCP tool call, verifier run.

The containment of this checkout against the one at ``--base-ref`` (default :data:`BASE_REF`, the
code before the host-boundary hardening), on the bundled ``library_1`` scenario, in one run.
Each repetition runs one worker process per side (alternating which goes first); a worker
imports ``echo_trl`` from its own tree (the base tree is ``git archive``'d into a temp dir) and
times, through the public runtime API both trees share:

* start: ``AWMRuntime(scenario).start()`` (database build, sandboxed server start, MCP
  handshake, tool list), wall clock;
* call: the median of ``--calls`` ``get_member`` tool calls of one episode;
* verify: ``Episode.verify()`` of task 0 (everything the host does around the verifier run).

Ratios are checkout / base of the medians over repetitions (goal: <= 1.10); ``paired`` is the
median over repetitions of each repetition's own ratio, which a shared machine's drifting load
disturbs less (both sides of a repetition run back to back).

    python benchmarks/environments/sandbox_cost.py [--quick] [--json] [--base-ref REF]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GOAL = 1.10
BASE_REF = "0cc36e3"  # main before the host-boundary hardening (symlinked files, keyring, seccomp, kill -9)
KEYS = ("start", "call", "verify")


def worker(calls: int) -> dict:
    """Time one runtime start, ``calls`` tool calls and one verifier run with the ``echo_trl`` on the path."""
    from echo_trl.envs.awm.runtime.episode import AWMRuntime
    from echo_trl.envs.awm.scenario.source import ScenarioSource

    scenario = ScenarioSource.from_dir(REPO / "data" / "awm_scenarios").load("library_1")
    t0 = time.perf_counter()
    rt = AWMRuntime(scenario, tool_timeout=60.0, verifier_timeout=60.0).start()
    start = time.perf_counter() - t0
    try:
        ep = rt.new_episode(0)
        assert ep.call_tool("get_member", {"member_id": 1})["reward_type"] == "tool_call_ok"  # warm
        lat = []
        for i in range(calls):
            t0 = time.perf_counter()
            obs = ep.call_tool("get_member", {"member_id": 1 + i % 5})
            lat.append(time.perf_counter() - t0)
            assert obs["reward_type"] == "tool_call_ok", obs
        t0 = time.perf_counter()
        obs = ep.verify()
        verify = time.perf_counter() - t0
        assert obs["verify_result"].get("execution_status") == "success", obs
    finally:
        rt.close()
    module = __import__("echo_trl").__file__
    return {"start": start, "call": statistics.median(lat), "verify": verify, "module": module}


def run_worker(tree: Path, calls: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "ECHO_TRL_PROGRESS": "0"}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", "--calls", str(calls)],
        env=env,
        cwd=str(tree),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"worker on {tree} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    expected = str(tree / "echo_trl" / "__init__.py")
    if result.pop("module") != expected:
        raise SystemExit(f"worker on {tree} did not import echo_trl from {expected}")
    return result


def run(args) -> dict:
    repeats = args.repeats or (3 if args.quick else 7)
    calls = args.calls or (20 if args.quick else 100)
    # in the checkout, not under /tmp: the base code cannot sandbox a checkout under /tmp
    with tempfile.TemporaryDirectory(prefix=".sandbox_cost_", dir=REPO) as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", args.base_ref, "echo_trl"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        trees = {"base": base, "new": REPO}
        results: dict[str, list[dict]] = {"base": [], "new": []}
        for r in range(repeats):
            for label in ("base", "new") if r % 2 == 0 else ("new", "base"):
                results[label].append(run_worker(trees[label], calls))
                print(f"repetition {r + 1}/{repeats} {label}: {results[label][-1]}", file=sys.stderr)
    med = {label: {k: statistics.median(x[k] for x in rows) for k in KEYS} for label, rows in results.items()}
    ratios = {k: med["new"][k] / med["base"][k] for k in KEYS}
    paired = {
        k: statistics.median(n[k] / b[k] for n, b in zip(results["new"], results["base"], strict=True)) for k in KEYS
    }
    print(f"{'':22}{'base':>10}{'new':>10}{'new/base':>10}{'paired':>10}")
    for k, name in (("start", "runtime start (s)"), ("call", "tool call (ms)"), ("verify", "verifier run (s)")):
        scale = 1000 if k == "call" else 1
        print(
            f"{name:22}{med['base'][k] * scale:10.3f}{med['new'][k] * scale:10.3f}{ratios[k]:10.3f}{paired[k]:10.3f}"
        )
    print(f"medians of {repeats} repetitions, {calls} calls each; base {args.base_ref}; goal new/base <= {GOAL}")
    out = {
        "repeats": repeats,
        "calls": calls,
        "base_ref": args.base_ref,
        "medians": med,
        "ratios": ratios,
        "paired_ratios": paired,
        "within_goal": {k: v <= GOAL for k, v in ratios.items()},
        "runs": results,
    }
    if args.json:
        print(json.dumps(out))
    return out


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 repetitions x 20 calls (default 7 x 100)")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--calls", type=int, default=None)
    p.add_argument("--base-ref", default=BASE_REF, help="git ref of the containment to compare against")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.calls)))
        return None
    return run(args)


if __name__ == "__main__":
    main()
