"""The AWM scenario server pool: start latency, resident memory per live server, episodes/s per bound.

Workload (what TRL's online loop does): batches of ``--prompts`` prompts x ``--generations``
rollouts, prompts assigned round-robin over ``--scenarios`` scenarios, and in each batch the
rollouts' tool calls interleaved in lockstep (TRL calls every rollout's tool, then generates
for all). Each rollout replays library_1's reference solution of task 0 (4 tool calls) and
runs the verifier; every reward must come out 1.0, so the per-session databases are checked
while they are timed. The scenarios are copies of library_1 under distinct names (AWM-1K's
scenarios differ in code, not in how the pool treats them; the shared samples hold only one
other runnable scenario).

Measured: ``start_latency_s`` (database build + sandboxed server start + MCP handshake, every
start of the run), ``rss_mb_per_server`` (VmRSS summed over each live server's process group,
from /proc, with the largest pool full), ``episodes_per_s`` per bound (timed after each
scenario's tools and snapshot are prepared, which TRL does at trainer init).

    python benchmarks/environments/awm_pool.py [--quick] [--json]
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py
os.environ.setdefault("ECHO_TRL_PROGRESS", "0")

from common import REPO, parser, report  # noqa: E402

from echo_trl.envs.awm.runtime.pool import ServerPool  # noqa: E402
from echo_trl.envs.awm.scenario.source import ScenarioSource  # noqa: E402
from echo_trl.sandbox import bwrap as sandbox  # noqa: E402

DATA = REPO / "data" / "awm_scenarios"


def reference_calls() -> list[tuple[str, dict]]:
    for line in (DATA / "solutions.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["task_idx"] == 0 and d["label"] == "reference":
            return [(c["tool_name"], c["arguments"]) for c in d["steps"]]
    raise SystemExit("no reference solution for library_1 task 0 in data/awm_scenarios/solutions.jsonl")


def group_rss_mb(pid: int) -> float:
    """Resident memory of a server's whole process group (sandbox wrapper + Python server), in MB."""
    total = 0
    for member in sandbox.group_members(pid) or [pid]:
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def run_pool(
    bound: int, scenarios: list, calls: list, episodes: int, prompts: int, generations: int, measure_rss: bool
) -> dict:
    with ServerPool(bound) as pool:
        for sc in scenarios:
            pool.add(sc)
            pool.tools(sc.name)  # tools + snapshot, as TRL's init probe does
        prepared_starts = pool.stats.starts
        rss = [group_rss_mb(pid) for _, pid in pool.live_servers()] if measure_rss else []
        t0 = time.perf_counter()
        rewards, done, k = [], 0, 0
        while done < episodes:
            batch = []
            for _ in range(prompts):
                name = scenarios[k % len(scenarios)].name
                k += 1
                batch += [pool.new_episode(name, 0) for _ in range(generations)]
            batch = batch[: episodes - done]
            for name, args in calls:
                for ep in batch:
                    ep.call_tool(name, args)
            for ep in batch:
                ep.verify("done")
                rewards.append(ep.reward)
                ep.close()
            done += len(batch)
        seconds = time.perf_counter() - t0
        stats = pool.stats
        return {
            "episodes_per_s": episodes / seconds,
            "seconds": seconds,
            "episodes": episodes,
            "server_starts": stats.starts - prepared_starts,
            "evictions": stats.evictions,
            "db_restores": stats.restores,
            "all_rewards_complete": all(r == 1.0 for r in rewards),
            "start_seconds": list(stats.start_seconds),
            "rss_mb": rss,
        }


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--scenarios", type=int, default=None, help="distinct scenarios (default 16; --quick 4)")
    p.add_argument("--pools", type=int, nargs="+", default=None, help="bounds on live servers (default 1 4 16)")
    p.add_argument("--episodes", type=int, default=None, help="timed episodes per bound (default 32; --quick 8)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per batch (default 4; --quick 2)")
    p.add_argument("--generations", type=int, default=2, help="rollouts per prompt (default 2)")
    args = p.parse_args(argv)
    n_scenarios = args.scenarios or (4 if args.quick else 16)
    pools = args.pools or ([1, 4] if args.quick else [1, 4, 16])
    episodes = args.episodes or (8 if args.quick else 32)
    prompts = args.prompts or (2 if args.quick else 4)
    base = ScenarioSource.from_dir(DATA).load("library_1")
    scenarios = [dataclasses.replace(base, name=f"library_1_copy{i}") for i in range(n_scenarios)]
    calls = reference_calls()
    per_pool, starts, rss = {}, [], []
    for bound in pools:
        r = run_pool(bound, scenarios, calls, episodes, prompts, args.generations, measure_rss=bound == max(pools))
        starts += r.pop("start_seconds")
        rss += r.pop("rss_mb")
        per_pool[str(bound)] = r
    results = {
        "benchmark": "awm_pool",
        "scenarios": n_scenarios,
        "episodes": episodes,
        "prompts_per_batch": prompts,
        "generations": args.generations,
        "tool_calls_per_episode": len(calls),
        "cpus": os.cpu_count(),
        "containment": sandbox.detect_containment().applied(),
        "start_latency_s": {
            "median": statistics.median(starts),
            "min": min(starts),
            "max": max(starts),
            "n": len(starts),
        },
        "rss_mb_per_server": {"median": statistics.median(rss), "max": max(rss), "n": len(rss), "at_pool": max(pools)}
        if rss
        else None,
        "per_pool": per_pool,
    }
    rows = [
        (
            b,
            f"{r['episodes_per_s']:.2f}",
            r["server_starts"],
            r["evictions"],
            r["db_restores"],
            str(r["all_rewards_complete"]),
        )
        for b, r in per_pool.items()
    ]
    print(
        f"{n_scenarios} scenarios, {episodes} episodes per bound, batches of {prompts} prompts x "
        f"{args.generations} rollouts; start latency median {results['start_latency_s']['median']:.2f}s "
        f"(n={len(starts)})"
        + (
            f"; RSS per live server median {results['rss_mb_per_server']['median']:.0f} MB (n={len(rss)})"
            if rss
            else ""
        )
    )
    report(rows, ("max_servers", "episodes/s", "starts", "evictions", "db restores", "rewards ok"), results, args)
    return results


if __name__ == "__main__":
    main()
