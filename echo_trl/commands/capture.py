"""``echo-trl capture``: run an AWM scenario locally and record episodes (OpenEnv capture shape).

    echo-trl capture --data DIR --scenario content_platform_1 --task-idx 0 \\
        --policy replay:scripts.jsonl --episodes 4 --output episodes/
    echo-trl capture --hub --scenario e_commerce_33 --policy model:./my-model --episodes 8 --output out/

Writes ``OUTPUT/<scenario>_task<K>.jsonl`` (one episode per line, appended in capture order;
``echo-trl build-dataset OUTPUT`` reads them) and ``OUTPUT/capture_log.txt`` (what ran, where
the data came from, the containment applied, timings). ``--episodes N`` is per task, so every
task gets a GRPO group of N episodes. The replay file format is in ``--help`` and in
``echo_trl/envs/awm/policy.py``; replaying recorded episodes (``--policy replay:DIR``) logs, per
step, whether the live observation equals the recorded one (timestamps normalised).

Episode semantics are AWM's: a format error (unknown tool, invalid arguments) does not end the
episode, its reward stays -1.0 (``--stop-on-format-error``: end at the first one). The
verifier step is a turn of the recorded conversation (``--verify-turn env_output``, OpenEnv's
RFC 010 mapping) or kept out of it under ``verification`` (``omit``: the official AWM agent
never shows the verifier to the policy, whose ``raw_result`` can give the answer away).

``--format awm-agent`` makes a model policy speak the official AWM agent's conversation (its
system prompt, ``list_tools`` / ``call_tool``, its call parsing; ``echo_trl.envs.awm.agent_format``)
and defaults ``--verify-turn`` to ``omit``; build the dataset with the same ``--format``.
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

from ..data.formats import FORMATS, VERIFY_TURNS, default_verify_turn
from ..data.prompt import DEFAULT_SYSTEM_PROMPT
from ..errors import EchoTrlError
from ..outputs import check_output_dir
from ..progress import progress
from .cli import ArgumentParser  # underscores, hyphen aliases, no abbreviations

REPLAY_HELP = """\
replay file (--policy replay:FILE), .jsonl = one script per line, .json = a list of scripts:
  {"task_idx": 0, "scenario": "content_platform_1", "label": "reference",
   "calls": [{"tool_name": "search_channels", "arguments": {"query": "Kurzgesagt"}}, ...],
   "final_answer": null, "verify": true}
Episode i of a task plays that task's script i mod n (reference + failures -> varied rewards).
FILE may also be recorded episodes (a capture output directory, OpenEnv capture-shape JSON/JSONL,
AWM trajectory.json): their calls are replayed once each (by default) and every live observation
is compared with the recorded one (capture_log.txt: 'replay check').
"""


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="echo-trl capture",
        description="Run an AWM scenario locally (SQLite + generated MCP server + "
        "code verifier, contained) and record episodes in the OpenEnv capture shape.",
        epilog=REPLAY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", metavar="DIR", help="AWM-1K-format directory with gen_*.jsonl files")
    src.add_argument("--hub", action="store_true", help="read the Hub dataset (through the local HF cache)")
    src.add_argument(
        "--openenv",
        metavar="URL",
        help="capture from a running OpenEnv agent_world_model_env server "
        "(e.g. http://localhost:8000) instead of running the scenario here",
    )
    p.add_argument("--hub-repo", default=None, help="Hub dataset id (default Snowflake/AgentWorldModel-1K)")
    p.add_argument("--revision", default=None, help="Hub revision")
    p.add_argument("--scenario", required=True, help="scenario name, e.g. content_platform_1")
    p.add_argument(
        "--task-idx",
        type=int,
        action="append",
        default=None,
        help="task index (repeatable); default: every task the policy can play",
    )
    p.add_argument("--policy", required=True, help="replay:FILE or model:PATH")
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes per task (default 1; replaying recorded episodes: each recording once)",
    )
    p.add_argument("--output", required=True, help="output directory")
    p.add_argument("--max-steps", type=int, default=8, help="model policy: tool calls per episode (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="model policy: tokens per turn (default 256)")
    p.add_argument("--temperature", type=float, default=1.0, help="model policy: sampling temperature")
    p.add_argument("--seed", type=int, default=0, help="model policy: sampling seed")
    p.add_argument("--trust-remote-code", action="store_true", help="model policy: allow the model's own code")
    p.add_argument(
        "--verifier-mode",
        choices=("code",),
        default="code",
        help="only code verifiers (SQL mode needs an LLM judge; use the Python API with judge=...)",
    )
    p.add_argument("--tool-timeout", type=float, default=30.0, help="seconds per tool call (default 30)")
    p.add_argument("--verifier-timeout", type=float, default=30.0, help="seconds per verifier run (default 30)")
    p.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run the generated server and verifier code WITHOUT the bubblewrap sandbox (recorded in "
        "the capture log); by default capture refuses where the sandbox cannot be had",
    )
    p.add_argument(
        "--stop-on-format-error",
        action="store_true",
        help="end an episode at its first unknown tool / invalid arguments (default: go on as AWM does; "
        "the episode reward stays -1.0 either way)",
    )
    p.add_argument("--continue-after-format-error", action="store_true", help=argparse.SUPPRESS)  # now the default
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="chat-template",
        help="model policy: the conversation it speaks: chat-template (tool schemas in the chat template, "
        "its tool calls; default) or awm-agent (the official AWM agent's list_tools/call_tool)",
    )
    p.add_argument(
        "--verify-turn",
        choices=VERIFY_TURNS,
        default=None,
        help="the verifier step as the last env_output turn of the recorded conversation (default with "
        "chat-template), or out of it under 'verification' (default with awm-agent: the policy never "
        "sees it, as in the official AWM agent)",
    )
    p.add_argument(
        "--system-prompt",
        default=DEFAULT_SYSTEM_PROMPT,
        help="model policy: system prompt ('{scenario}' is filled in, other braces are text; '' for none; "
        "awm-agent: the official agent's unless given)",
    )
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from ..envs.awm.episode import AWMRuntime
    from ..envs.awm.policy import PolicyError, ReplayPolicy, play_episode
    from ..envs.awm.scenario import HUB_REPO_ID, ScenarioSource

    if threading.current_thread() is threading.main_thread():
        # SIGTERM -> SystemExit: the runtime's context manager still kills the server and removes its dir.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.episodes is not None and args.episodes < 1:
        raise EchoTrlError("--episodes must be >= 1")
    args.verify_turn = args.verify_turn or default_verify_turn(args.format)
    if args.stop_on_format_error and args.continue_after_format_error:
        raise EchoTrlError("--stop-on-format-error and --continue-after-format-error contradict each other")
    kind, _, target = args.policy.partition(":")
    if kind not in ("replay", "model") or not target:
        raise EchoTrlError(f"--policy must be replay:FILE or model:PATH, got {args.policy!r}")
    if args.openenv:
        return _capture_openenv(args, kind, target)
    source = (
        ScenarioSource.from_dir(args.data)
        if args.data
        else ScenarioSource.from_hub(args.hub_repo or HUB_REPO_ID, revision=args.revision)
    )
    scenario = source.load(args.scenario)
    if kind == "replay":
        policy = ReplayPolicy.from_file(target)
        tasks = args.task_idx or policy.tasks(scenario.name)
        if not tasks:
            raise PolicyError(f"the replay file has no scripts for scenario {scenario.name!r}")
    else:
        policy = _model_policy(args, target)
        tasks = args.task_idx or list(range(len(scenario.tasks)))
    for k in tasks:
        scenario.task(k)  # range check with a clear error before anything starts
    out = check_output_dir(Path(args.output))

    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    rewards: dict[int, list[float]] = {}
    jobs = _jobs(args, policy, scenario.name, tasks)
    replay_checks: list[tuple[int, int, str]] = []
    with AWMRuntime(
        scenario,
        tool_timeout=args.tool_timeout,
        verifier_timeout=args.verifier_timeout,
        verifier_mode=args.verifier_mode,
        format_error_ends_episode=args.stop_on_format_error,
        unsafe_no_sandbox=args.unsafe_no_sandbox,
    ) as runtime:
        t_ready = time.perf_counter()
        with contextlib.ExitStack() as stack:
            files = {
                k: stack.enter_context(open(out / f"{scenario.name}_task{k}.jsonl", "a", encoding="utf-8"))
                for k in tasks
            }
            for k, i in progress(jobs, desc=f"capture {scenario.name}", unit="episode", total=len(jobs)):
                record = play_episode(policy, runtime.new_episode(k), i, args.verify_turn)
                record["metadata"]["format"] = args.format
                replay_checks.extend(_replay_check(record, k, i))
                files[k].write(json.dumps(record, ensure_ascii=False) + "\n")
                files[k].flush()
                counts[record["reward_type"]] = counts.get(record["reward_type"], 0) + 1
                rewards.setdefault(k, []).append(record["reward"])
        timings = dict(runtime.timings)
        containment = runtime.containment
        database = runtime.build_report.summary() if runtime.build_report is not None else "-"
    elapsed = time.perf_counter() - t0
    loop = time.perf_counter() - t_ready
    lines = [
        f"scenario: {scenario.name}",
        f"source: {source!r} ({json.dumps(scenario.sources)})",
        f"database: {database}",
        f"policy: {args.policy}",
        f"tasks: {tasks}",
        f"episodes: {len(jobs)} ({_per_task(jobs)} per task)",
        f"format errors: {'end the episode' if args.stop_on_format_error else 'the episode goes on'}; "
        f"verifier turn: {args.verify_turn}",
        f"outcomes: {json.dumps(counts, sort_keys=True)}",
        *_replay_lines(replay_checks),
        "rewards per task: " + json.dumps({str(k): v for k, v in rewards.items()}),
        f"containment: {'; '.join(containment.applied())}",
        f"containment notes: {'; '.join(containment.notes) or '-'}",
        f"unsafe-no-sandbox: {'yes (generated code ran uncontained)' if args.unsafe_no_sandbox else 'no'}",
        f"timings (s): total {elapsed:.2f}, episodes {loop:.2f} ({len(jobs) / loop:.2f} episodes/s), "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(timings.items())),
    ]
    with open(out / "capture_log.txt", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")
    print("\n".join(lines), file=sys.stderr)
    print(str(out))
    return 0


def _model_policy(args: argparse.Namespace, target: str):
    from ..envs.awm.agent_format import AWMAgentModelPolicy
    from ..envs.awm.policy import ModelPolicy

    system_prompt = args.system_prompt or None
    if args.format == "awm-agent":
        cls = AWMAgentModelPolicy
        system_prompt = None if args.system_prompt == DEFAULT_SYSTEM_PROMPT else system_prompt
    else:
        cls = ModelPolicy
    return cls.from_pretrained(
        target,
        trust_remote_code=args.trust_remote_code,
        max_steps=args.max_steps,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        system_prompt=system_prompt,
    )


def _jobs(args: argparse.Namespace, policy, scenario: str, tasks: list[int]) -> list[tuple[int, int]]:
    """(task, episode index) pairs: --episodes per task; recorded episodes each once by default."""
    from ..envs.awm.policy import ReplayPolicy

    def per_task(k: int) -> int:
        if args.episodes is not None:
            return args.episodes
        if isinstance(policy, ReplayPolicy) and policy.recorded:
            return max(1, policy.count(scenario, k))
        return 1

    return [(k, i) for k in tasks for i in range(per_task(k))]


def _per_task(jobs: list[tuple[int, int]]) -> str:
    counts = sorted({sum(1 for k2, _ in jobs if k2 == k) for k, _ in jobs})
    return "/".join(map(str, counts))


def _replay_check(record: dict, task_idx: int, index: int) -> list[tuple[int, int, str]]:
    """(same, steps, log line) for a replayed recording: each step's observation equal to the recorded one?"""
    steps = [*record["steps"], *([record["verification"]] if "verification" in record else [])]
    checked = [s for s in steps if "replay_match" in s]
    marks = [s["replay_match"] for s in checked]
    if not marks:
        return []
    source = next((n[len("replay ") :] for n in record["metadata"].get("notes", []) if n.startswith("replay ")), "?")
    per_step = " ".join(
        f"{n}:same" if s["replay_match"] else f"{n}:DIFFERENT({'; '.join(s.get('replay_diff', []))})"
        for n, s in enumerate(checked, 1)
    )
    return [
        (
            sum(marks),
            len(marks),
            f"replay check task {task_idx} episode {index} ({source}): {sum(marks)}/{len(marks)} same [{per_step}]",
        )
    ]


def _replay_lines(checks: list[tuple[int, int, str]]) -> list[str]:
    if not checks:
        return []
    same, total = sum(c[0] for c in checks), sum(c[1] for c in checks)
    return [c[2] for c in checks] + [
        f"replay check total: {same}/{total} live observations equal the recorded ones "
        "(text with timestamps normalised, reward type, reward)"
    ]


def _capture_openenv(args: argparse.Namespace, kind: str, target: str) -> int:
    from ..envs.awm.openenv import capture_openenv_episode
    from ..envs.awm.policy import ReplayPolicy

    if kind == "replay":
        policy = ReplayPolicy.from_file(target)
        tasks = args.task_idx or policy.tasks(args.scenario)
    else:
        policy = _model_policy(args, target)
        tasks = args.task_idx
    if not tasks:
        raise EchoTrlError("--openenv needs --task-idx (or a replay file with scripts for the scenario)")
    out = check_output_dir(Path(args.output))
    jobs = _jobs(args, policy, args.scenario, tasks)
    t0 = time.perf_counter()
    checks: list[tuple[int, int, str]] = []
    for k, i in progress(jobs, desc=f"capture {args.scenario} (OpenEnv)", unit="episode", total=len(jobs)):
        record = capture_openenv_episode(
            args.openenv,
            args.scenario,
            k,
            policy,
            episode_index=i,
            verifier_mode=args.verifier_mode,
            timeout=args.tool_timeout * 2,
            stop_on_format_error=args.stop_on_format_error,
            verify_turn=args.verify_turn,
        )
        checks.extend(_replay_check(record, k, i))
        with open(out / f"{args.scenario}_task{k}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    lines = [
        f"captured {len(jobs)} episodes of {args.scenario} from OpenEnv server {args.openenv} "
        f"in {time.perf_counter() - t0:.2f}s",
        *_replay_lines(checks),
    ]
    with open(out / "capture_log.txt", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")
    print("\n".join(lines), file=sys.stderr)
    print(str(out))
    return 0
