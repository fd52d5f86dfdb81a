"""``echo-trl capture``: run an AWM scenario locally and record episodes (OpenEnv capture shape).

    echo-trl capture --data DIR --scenario content_platform_1 --task-idx 0 \\
        --policy replay:scripts.jsonl --episodes 4 --output episodes/
    echo-trl capture --hub --scenario e_commerce_33 --policy model:./my-model --episodes 8 --output out/

Writes ``OUTPUT/<scenario>_task<K>.jsonl`` (one episode per line, appended in capture order;
``echo-trl build-dataset OUTPUT`` reads them) and ``OUTPUT/capture_log.txt`` (what ran, where
the data came from, the containment applied, timings). ``--episodes N`` is per task, so every
task gets a GRPO group of N episodes. The replay file format is in ``--help`` and in
``echo_trl/envs/awm/policy.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from pathlib import Path

from ..errors import EchoTrlError
from ..outputs import check_output_dir
from ..progress import progress

REPLAY_HELP = """\
replay file (--policy replay:FILE), .jsonl = one script per line, .json = a list of scripts:
  {"task_idx": 0, "scenario": "content_platform_1", "label": "reference",
   "calls": [{"tool_name": "search_channels", "arguments": {"query": "Kurzgesagt"}}, ...],
   "final_answer": null, "verify": true}
Episode i of a task plays that task's script i mod n (reference + failures -> varied rewards).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="echo-trl capture", description="Run an AWM scenario locally (SQLite + generated MCP server + "
        "code verifier, contained) and record episodes in the OpenEnv capture shape.",
        epilog=REPLAY_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="DIR", help="AWM-1K-format directory with gen_*.jsonl files")
    src.add_argument("--hub", action="store_true", help="read the Hub dataset (through the local HF cache)")
    src.add_argument("--openenv", metavar="URL", help="capture from a running OpenEnv agent_world_model_env server "
                     "(e.g. http://localhost:8000) instead of running the scenario here")
    p.add_argument("--hub-repo", default=None, help="Hub dataset id (default Snowflake/AgentWorldModel-1K)")
    p.add_argument("--revision", default=None, help="Hub revision")
    p.add_argument("--scenario", required=True, help="scenario name, e.g. content_platform_1")
    p.add_argument("--task-idx", type=int, action="append", default=None,
                   help="task index (repeatable); default: every task the policy can play")
    p.add_argument("--policy", required=True, help="replay:FILE or model:PATH")
    p.add_argument("--episodes", type=int, default=1, help="episodes per task (default 1)")
    p.add_argument("--output", required=True, help="output directory")
    p.add_argument("--max-steps", type=int, default=8, help="model policy: tool calls per episode (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="model policy: tokens per turn (default 256)")
    p.add_argument("--temperature", type=float, default=1.0, help="model policy: sampling temperature")
    p.add_argument("--seed", type=int, default=0, help="model policy: sampling seed")
    p.add_argument("--trust-remote-code", action="store_true", help="model policy: allow the model's own code")
    p.add_argument("--verifier-mode", choices=("code",), default="code",
                   help="only code verifiers (SQL mode needs an LLM judge; use the Python API with judge=...)")
    p.add_argument("--tool-timeout", type=float, default=30.0, help="seconds per tool call (default 30)")
    p.add_argument("--verifier-timeout", type=float, default=30.0, help="seconds per verifier run (default 30)")
    p.add_argument("--continue-after-format-error", action="store_true",
                   help="do not end an episode at an unknown tool / invalid arguments (default: end, reward -1)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from ..envs.awm.episode import AWMRuntime
    from ..envs.awm.policy import ModelPolicy, PolicyError, ReplayPolicy
    from ..envs.awm.scenario import HUB_REPO_ID, ScenarioSource

    if threading.current_thread() is threading.main_thread():
        # SIGTERM -> SystemExit: the runtime's context manager still kills the server and removes its dir.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.episodes < 1:
        raise EchoTrlError("--episodes must be >= 1")
    kind, _, target = args.policy.partition(":")
    if kind not in ("replay", "model") or not target:
        raise EchoTrlError(f"--policy must be replay:FILE or model:PATH, got {args.policy!r}")
    if args.openenv:
        return _capture_openenv(args, kind, target)
    source = (ScenarioSource.from_dir(args.data) if args.data else
              ScenarioSource.from_hub(args.hub_repo or HUB_REPO_ID, revision=args.revision))
    scenario = source.load(args.scenario)
    if kind == "replay":
        policy = ReplayPolicy.from_file(target)
        tasks = args.task_idx or policy.tasks(scenario.name)
        if not tasks:
            raise PolicyError(f"the replay file has no scripts for scenario {scenario.name!r}")
    else:
        policy = ModelPolicy.from_pretrained(target, trust_remote_code=args.trust_remote_code,
                                             max_steps=args.max_steps, max_new_tokens=args.max_new_tokens,
                                             temperature=args.temperature, seed=args.seed)
        tasks = args.task_idx or list(range(len(scenario.tasks)))
    for k in tasks:
        scenario.task(k)  # range check with a clear error before anything starts
    out = check_output_dir(Path(args.output))

    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    rewards: dict[int, list[float]] = {}
    jobs = [(k, i) for k in tasks for i in range(args.episodes)]
    with AWMRuntime(scenario, tool_timeout=args.tool_timeout, verifier_timeout=args.verifier_timeout,
                    verifier_mode=args.verifier_mode,
                    format_error_ends_episode=not args.continue_after_format_error) as runtime:
        t_ready = time.perf_counter()
        with contextlib.ExitStack() as stack:
            files = {k: stack.enter_context(open(out / f"{scenario.name}_task{k}.jsonl", "a", encoding="utf-8"))
                     for k in tasks}
            for k, i in progress(jobs, desc=f"capture {scenario.name}", unit="episode", total=len(jobs)):
                episode = runtime.new_episode(k)
                try:
                    policy.play(episode, i)
                    if not episode.done:
                        episode.verify()
                finally:
                    episode.close()
                record = episode.record()
                files[k].write(json.dumps(record, ensure_ascii=False) + "\n")
                files[k].flush()
                counts[record["reward_type"]] = counts.get(record["reward_type"], 0) + 1
                rewards.setdefault(k, []).append(record["reward"])
        timings = dict(runtime.timings)
        containment = runtime.containment
    elapsed = time.perf_counter() - t0
    loop = time.perf_counter() - t_ready
    lines = [
        f"scenario: {scenario.name}", f"source: {source!r} ({json.dumps(scenario.sources)})",
        f"policy: {args.policy}", f"tasks: {tasks}", f"episodes: {len(jobs)} ({args.episodes} per task)",
        f"outcomes: {json.dumps(counts, sort_keys=True)}",
        "rewards per task: " + json.dumps({str(k): v for k, v in rewards.items()}),
        f"containment: {'; '.join(containment.applied())}",
        f"containment notes: {'; '.join(containment.notes) or '-'}",
        f"timings (s): total {elapsed:.2f}, episodes {loop:.2f} ({len(jobs) / loop:.2f} episodes/s), "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(timings.items())),
    ]
    with open(out / "capture_log.txt", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")
    print("\n".join(lines), file=sys.stderr)
    print(str(out))
    return 0


def _capture_openenv(args: argparse.Namespace, kind: str, target: str) -> int:
    from ..envs.awm.openenv import capture_openenv_episode
    from ..envs.awm.policy import ModelPolicy, ReplayPolicy

    if kind == "replay":
        policy = ReplayPolicy.from_file(target)
        tasks = args.task_idx or policy.tasks(args.scenario)
    else:
        policy = ModelPolicy.from_pretrained(target, trust_remote_code=args.trust_remote_code,
                                             max_steps=args.max_steps, max_new_tokens=args.max_new_tokens,
                                             temperature=args.temperature, seed=args.seed)
        tasks = args.task_idx
    if not tasks:
        raise EchoTrlError("--openenv needs --task-idx (or a replay file with scripts for the scenario)")
    out = check_output_dir(Path(args.output))
    jobs = [(k, i) for k in tasks for i in range(args.episodes)]
    t0 = time.perf_counter()
    for k, i in progress(jobs, desc=f"capture {args.scenario} (OpenEnv)", unit="episode", total=len(jobs)):
        record = capture_openenv_episode(args.openenv, args.scenario, k, policy, episode_index=i,
                                         verifier_mode=args.verifier_mode, timeout=args.tool_timeout * 2)
        with open(out / f"{args.scenario}_task{k}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    line = (f"captured {len(jobs)} episodes of {args.scenario} from OpenEnv server {args.openenv} "
            f"in {time.perf_counter() - t0:.2f}s")
    with open(out / "capture_log.txt", "a", encoding="utf-8") as fh:
        fh.write(line + "\n\n")
    print(line, file=sys.stderr)
    print(str(out))
    return 0
