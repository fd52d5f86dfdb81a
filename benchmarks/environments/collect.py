"""Collection throughput: episodes/s of ``capture --policy openai:URL`` at several concurrencies, and what bounds it.

Workload: library_1 (all 10 tasks, round-robin), ``--episodes`` per concurrency level, at most 2 turns of at most 8
tokens per episode, against ``transformers serve`` on this machine (CPU) with the tiny local model of the capture
tests (tests/helpers/inference_server.py: a Qwen2 whose turns are library_1 tool calls or an answer; its prompt
with library_1's 34 tool schemas is ~7.6k tokens). Each level collects into a fresh output with the real command
(a subprocess, as a user runs it) and reads its ``capture_summary.json``.

What bounds it, per level, from the records and one probe:

* ``server_s_per_request``: the median latency of single requests to the idle server (the probe);
* ``server_busy``: turns of the run x that latency / wall time: near 1, the server is saturated (it generates one
  request at a time), so more episodes in flight cannot help;
* ``env_s_per_episode``: the environment's own seconds per episode (tool calls and verifier, from each step's
  ``latency_s``), and ``env_share``: their sum over wall time x concurrency (the share of in-flight time spent in
  the environments);
* the rest (``collector_share``) is the collector and set-up: scenario-server starts (``scenario_server_starts``,
  ~1-3 s each, counted in the wall time; at most ``--max-servers``), episode set-up on the pool, alignment,
  writing.

    python benchmarks/environments/collect.py [--quick] [--json] [--episodes 24] [--concurrency 1 4 16]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the capture tests' model and server
os.environ.setdefault("ECHO_TRL_PROGRESS", "0")

from common import REPO, parser, report  # noqa: E402

DATA = REPO / "data" / "awm_scenarios"


def probe_latency(url: str, model: Path, n: int = 5) -> float:
    """Median seconds of one chat completion with library_1's real prompt (tools included) on the idle server."""
    from echo_trl.data.readers.records import awm_episode_to_trajectory

    episode = json.loads((REPO / "data" / "episodes" / "library_1_task0.jsonl").read_text().splitlines()[0])
    traj = awm_episode_to_trajectory(episode)
    body = {"model": str(model), "messages": traj.prompt, "tools": traj.tools, "max_tokens": 8, "temperature": 1.0}
    times = []
    for _ in range(n + 1):
        request = urllib.request.Request(
            f"{url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=300) as r:
            r.read()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])  # the first loads the model


def collect(url: str, model: Path, out: Path, episodes: int, concurrency: int) -> dict:
    per_task = max(1, episodes // 10)
    tasks = [str(k) for k in range(min(10, episodes))]
    cmd = [sys.executable, "-m", "echo_trl.commands.cli", "capture", "--data", str(DATA), "--scenario", "library_1"]
    cmd += [x for k in tasks for x in ("--task-idx", k)]
    cmd += ["--episodes", str(per_task), "--policy", f"openai:{url}", "--model", str(model), "--max-steps", "2"]
    cmd += ["--max-new-tokens", "8", "--concurrency", str(concurrency), "--output", str(out), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"capture failed: {done.stderr[-2000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    records = [json.loads(x) for f in out.glob("*_task*.jsonl") for x in f.read_text().splitlines()]
    env_s = [
        sum(
            s["observation"].get("metadata", {}).get("latency_s", 0.0)
            for s in [*r["steps"], *([r["verification"]] if "verification" in r else [])]
        )
        for r in records
    ]
    turns = sum(len(r["sampler"]["turns"]) for r in records)
    return {"summary": summary, "env_s": env_s, "turns": turns}


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=None, help="episodes per concurrency level (default 30, quick 10)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    args = p.parse_args(argv)
    episodes = args.episodes or (10 if args.quick else 30)

    from helpers.inference_server import TransformersServer, tool_calling_model

    root = Path(tempfile.mkdtemp(prefix="echo_collect_bench_"))
    model = tool_calling_model(root / "model")
    server = TransformersServer(None, root / "serve.log").start()
    results: dict = {"episodes": episodes, "server": "transformers serve (CPU, one request at a time)", "levels": {}}
    rows = []
    try:
        latency = probe_latency(server.url, model)
        results["server_s_per_request"] = round(latency, 3)
        for c in args.concurrency:
            got = collect(server.url, model, root / f"out{c}", episodes, c)
            run = got["summary"]["run"]
            wall = run["seconds"]
            env_total = sum(got["env_s"])
            busy = got["turns"] * latency / wall
            env_share = env_total / (wall * c)
            level = {
                "episodes": run["episodes"],
                "episodes_per_s": run["episodes_per_s"],
                "seconds": wall,
                "turns": got["turns"],
                "server_busy": round(busy, 3),
                "env_s_per_episode": round(env_total / max(1, len(got["env_s"])), 3),
                "env_share": round(env_share, 3),
                "collector_share": round(max(0.0, 1 - min(1.0, busy) - env_share), 3),
                "scenario_server_starts": run["server_starts"],
            }
            results["levels"][str(c)] = level
            shares = {"server": busy, "environments": env_share, "collector / set-up": level["collector_share"]}
            bound = max(shares, key=shares.get)
            level["bound_by"] = bound
            rows.append(
                (
                    str(c),
                    str(level["episodes"]),
                    f"{level['episodes_per_s']:.3f}",
                    f"{level['server_busy']:.2f}",
                    f"{level['env_s_per_episode']:.2f}",
                    str(level["scenario_server_starts"]),
                    bound,
                )
            )
    finally:
        server.stop()
    print(f"server: {results['server']}, {latency:.2f}s per request (library_1 prompt, 8 new tokens)")
    header = ("concurrency", "episodes", "episodes/s", "server busy", "env s/episode", "server starts", "bound by")
    report(rows, header, results, args)
    return results


if __name__ == "__main__":
    main()
