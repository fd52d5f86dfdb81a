"""``echo-trl capture``: play AWM scenarios locally and record episodes (OpenEnv capture shape).

    echo-trl capture --data DIR --scenario content_platform_1 --task-idx 0 \\
        --policy replay:scripts.jsonl --episodes 4 --output episodes/
    echo-trl capture --data AWM1K_DIR --all-scenarios --policy openai:http://127.0.0.1:8000/v1 \\
        --model Qwen/Qwen3-4B --episodes 8 --concurrency 16 --output rollouts/

Many scenarios (``--scenario`` repeatable, ``--scenario-file``, ``--all-scenarios``) and tasks
(``--task-idx``, default every task) in one command; ``--episodes N`` per task, so every task gets
a GRPO group of N episodes; ``--concurrency N`` episodes in flight over one bounded pool of scenario
servers (``--max-servers``). Policies: ``replay:FILE`` (scripts or recorded episodes), ``model:PATH``
(transformers ``generate`` in this process) or ``openai:URL`` (an OpenAI-compatible server: vLLM,
SGLang, ``transformers serve``, a hosted API; ``echo_trl.envs.awm.policies.openai``).

Output (``echo_trl.envs.awm.capture.store``): ``OUTPUT/<scenario>_task<K>.jsonl``, each episode appended
as one whole line when it finishes (``echo-trl build-dataset OUTPUT`` reads them); a rerun with the
same output continues where a killed run stopped and never writes an episode twice; ``capture_state.json``
(the settings; a rerun with other ones is refused), ``capture_summary.json`` (episodes, reward mean
per scenario, outcomes, format and tool errors, tokens, log-prob alignment) and ``capture_log.txt``.

Sampler log-probs: with ``openai:`` the server is asked for its sampled token ids and log-probs
(``--logprobs auto``: vLLM returns them, a server that refuses the fields is asked without); with
``model:`` they are computed at generation. Each turn is compared with the trainer's tokenization of
the same conversation (``--tokenizer``, default the model's; ``echo_trl.tokens.sampled``): an
episode whose turns all agree gets ``behavior_logprobs``, any other keeps none and its flagged turns
are counted in the summary. Build the dataset with the capture's ``--format``, ``--verify-turn`` and
``--system-prompt``: they decide the conversation the log-probs are aligned to.

Episode semantics are AWM's: a format error (unknown tool, invalid arguments) does not end the
episode, its reward stays -1.0 (``--stop-on-format-error``: end at the first one). The
verifier step is a turn of the recorded conversation (``--verify-turn env_output``, OpenEnv's
RFC 010 mapping) or kept out of it under ``verification`` (``omit``: the official AWM agent
never shows the verifier to the policy, whose ``raw_result`` can give the answer away).

``--format awm-agent`` makes a model policy speak the official AWM agent's conversation (its
system prompt, ``list_tools`` / ``call_tool``, its call parsing; ``echo_trl.envs.awm.policies.model``)
and defaults ``--verify-turn`` to ``omit``; build the dataset with the same ``--format``.
Replaying recorded episodes (``--policy replay:DIR``) logs, per step, whether the live observation
equals the recorded one (timestamps normalised).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

from ..data.formats import FORMATS, VERIFY_TURNS, default_verify_turn
from ..data.prompt import DEFAULT_SYSTEM_PROMPT
from ..errors import EchoTrlError
from ..io.outputs import check_output_dir
from ..progress import progress
from .capture_parser import (  # underscores, hyphen aliases, no abbreviations (until capture uses ..command_line)
    ArgumentParser,
    non_negative_float,
    positive_float,
    positive_int,
)
from .capture_run import collect_local, episodes_per_task, model_policy

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
    p.add_argument(
        "--scenario", action="append", default=None, help="scenario name (repeatable), e.g. content_platform_1"
    )
    p.add_argument("--scenario-file", metavar="FILE", help="scenario names, one per line ('#' starts a comment)")
    p.add_argument(
        "--all-scenarios",
        action="store_true",
        help="every scenario of --data / --hub that has server code (the others are listed in the log)",
    )
    p.add_argument(
        "--task-idx",
        type=int,
        action="append",
        default=None,
        help="task index (repeatable, for every scenario); default: every task the policy can play",
    )
    p.add_argument("--policy", required=True, help="replay:FILE, model:PATH or openai:URL")
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes per task: a GRPO group (default 1; replaying recorded episodes: each recording once)",
    )
    p.add_argument("--output", required=True, help="output directory (a rerun with the same one continues it)")
    p.add_argument("--concurrency", type=int, default=1, help="episodes in flight at once (default 1)")
    p.add_argument(
        "--max-servers",
        type=positive_int,
        default=None,
        help="scenario servers alive at once (default: --concurrency, <= 8)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    srv = p.add_argument_group("openai:URL policy (an OpenAI-compatible server)")
    srv.add_argument("--model", default=None, help="the served model's name (required with openai:URL)")
    srv.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key (default %(default)s)",
    )
    srv.add_argument("--request-timeout", type=positive_float, default=300.0, help="seconds per request (default 300)")
    srv.add_argument("--max-retries", type=int, default=5, help="retries on 429 / 5xx / lost connections (default 5)")
    srv.add_argument(
        "--retry-backoff", type=non_negative_float, default=1.0, help="first retry wait in seconds, doubling"
    )
    srv.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (default 1.0)")
    srv.add_argument(
        "--logprobs",
        choices=("auto", "on", "off"),
        default="auto",
        help="ask for the sampler's token ids and log-probs (vLLM): auto falls back when the server refuses",
    )
    srv.add_argument(
        "--tokenizer",
        default=None,
        help="the trainer's tokenizer, to align sampled log-probs with its tokenization (default: --model)",
    )
    p.add_argument("--max-steps", type=positive_int, default=8, help="model policy: turns per episode (default 8)")
    p.add_argument(
        "--max-new-tokens", type=positive_int, default=256, help="model policy: tokens per turn (default 256)"
    )
    p.add_argument("--temperature", type=float, default=1.0, help="model policy: sampling temperature")
    p.add_argument("--seed", type=int, default=0, help="model policy: sampling seed")
    p.add_argument("--trust-remote-code", action="store_true", help="model policy: allow the model's own code")
    p.add_argument(
        "--verifier-mode",
        choices=("code",),
        default="code",
        help="only code verifiers (SQL mode needs an LLM judge; use the Python API with judge=...)",
    )
    p.add_argument("--tool-timeout", type=positive_float, default=30.0, help="seconds per tool call (default 30)")
    p.add_argument(
        "--verifier-timeout", type=positive_float, default=30.0, help="seconds per verifier run (default 30)"
    )
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
    if threading.current_thread() is threading.main_thread():
        # SIGTERM -> SystemExit: finished episodes are written, the servers killed, their dirs removed.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.episodes is not None and args.episodes < 1:
        raise EchoTrlError("--episodes must be >= 1")
    if args.concurrency < 1:
        raise EchoTrlError("--concurrency must be >= 1")
    args.verify_turn = args.verify_turn or default_verify_turn(args.format)
    if args.stop_on_format_error and args.continue_after_format_error:
        raise EchoTrlError("--stop-on-format-error and --continue-after-format-error contradict each other")
    kind, _, target = args.policy.partition(":")
    if kind not in ("replay", "model", "openai") or not target:
        raise EchoTrlError(f"--policy must be replay:FILE, model:PATH or openai:URL, got {args.policy!r}")
    if kind == "model" and args.concurrency > 1:
        raise EchoTrlError("--policy model: generates in this process, one episode at a time: use --concurrency 1")
    if args.openenv:
        if len(args.scenario or []) != 1 or args.scenario_file or args.all_scenarios:
            raise EchoTrlError("--openenv captures one scenario: give exactly one --scenario")
        args.scenario = args.scenario[0]
        return _capture_openenv(args, kind, target)
    if not (args.scenario or args.scenario_file or args.all_scenarios):
        raise EchoTrlError("give --scenario NAME (repeatable), --scenario-file FILE or --all-scenarios")
    checks: list[tuple[int, int, str]] = []

    def replay_check(record: dict) -> None:
        checks.extend(_replay_check(record, record["task_idx"], record["metadata"]["episode"]["index"]))

    summary, lines, out = collect_local(args, kind, target, on_record=replay_check)
    lines += _replay_lines(checks)
    with open(out / "capture_log.txt", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")
    print("\n".join(lines), file=sys.stderr)
    print(json.dumps(summary) if args.json else str(out))
    return 0


def _jobs(args: argparse.Namespace, policy, scenario: str, tasks: list[int]) -> list[tuple[int, int]]:
    """(task, episode index) pairs: --episodes per task; recorded episodes each once by default."""
    return [(k, i) for k in tasks for i in range(episodes_per_task(args, policy, scenario, k))]


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
    from ..envs.awm.capture.openenv import capture_openenv_episode
    from ..envs.awm.capture.store import EpisodeStore
    from ..envs.awm.policies.replay import ReplayPolicy

    if kind == "replay":
        policy = ReplayPolicy.from_file(target)
        tasks = args.task_idx or policy.tasks(args.scenario)
    else:
        policy = model_policy(args, target)
        tasks = args.task_idx
    if not tasks:
        raise EchoTrlError("--openenv needs --task-idx (or a replay file with scripts for the scenario)")
    out = check_output_dir(Path(args.output))
    jobs = _jobs(args, policy, args.scenario, tasks)
    t0 = time.perf_counter()
    checks: list[tuple[int, int, str]] = []
    store = EpisodeStore(out)  # one writer, whole fsynced lines, a torn last line cut
    store.acquire()
    try:
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
            store.append(f"{args.scenario}_task{k}.jsonl", record)
    finally:
        store.release()
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
