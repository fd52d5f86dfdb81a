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

import json
import signal
import sys
import threading
import time
from pathlib import Path

from ...command_line import CommandParser, command_parser, parse_command
from ...errors import EchoTrlError
from ...io.outputs import check_output_dir
from ...progress import progress
from ...redact import redact
from .args import CaptureArguments
from .run import collect_local, episodes_per_task, model_policy

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


def make_parser() -> CommandParser:
    return command_parser(
        "echo-trl capture",
        [CaptureArguments],
        usage="echo-trl capture (--data DIR | --hub | --openenv URL) --policy POLICY --output OUTPUT "
        "[--config YAML] [FLAGS...]",
        description="Run an AWM scenario locally (SQLite + generated MCP server + "
        "code verifier, contained) and record episodes in the OpenEnv capture shape.",
        epilog=REPLAY_HELP,
    )


def parse_args(argv: list[str]) -> CaptureArguments:
    """The flags (and ``--config``), checked: a usage error ends the process in one line, exit 2."""
    (args,) = parse_command(make_parser(), argv)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM -> SystemExit: finished episodes are written, the servers killed, their dirs removed.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.openenv:
        return _capture_openenv(args)
    checks: list[tuple[int, int, str]] = []

    def replay_check(record: dict) -> None:
        checks.extend(_replay_check(record, record["task_idx"], record["metadata"]["episode"]["index"]))

    summary, lines, out = collect_local(args, on_record=replay_check)
    lines = [redact(line) for line in [*lines, *_replay_lines(checks)]]
    with open(out / "capture_log.txt", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")
    print("\n".join(lines), file=sys.stderr)
    print(json.dumps(summary) if args.json else str(out))
    return 0


def _jobs(args: CaptureArguments, policy, scenario: str, tasks: list[int]) -> list[tuple[int, int]]:
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


def _capture_openenv(args: CaptureArguments) -> int:
    """Capture the one ``--scenario`` from the OpenEnv server at ``--openenv`` into ``--output``."""
    from ...envs.awm.capture.openenv import capture_openenv_episode
    from ...envs.awm.capture.store import EpisodeStore
    from ...envs.awm.policies.replay import ReplayPolicy

    (scenario,) = args.scenario
    if args.policy_kind == "replay":
        policy = ReplayPolicy.from_file(args.policy_target)
        tasks = args.task_idx or policy.tasks(scenario)
    else:
        policy = model_policy(args, args.policy_target)
        tasks = args.task_idx
    if not tasks:
        raise EchoTrlError("--openenv needs --task-idx (or a replay file with scripts for the scenario)")
    out = check_output_dir(Path(args.output))
    jobs = _jobs(args, policy, scenario, tasks)
    t0 = time.perf_counter()
    checks: list[tuple[int, int, str]] = []
    store = EpisodeStore(out)  # one writer, whole fsynced lines, a torn last line cut
    store.acquire()
    try:
        for k, i in progress(jobs, desc=f"capture {scenario} (OpenEnv)", unit="episode", total=len(jobs)):
            record = capture_openenv_episode(
                args.openenv,
                scenario,
                k,
                policy,
                episode_index=i,
                verifier_mode=args.verifier_mode,
                timeout=args.tool_timeout * 2,
                stop_on_format_error=args.stop_on_format_error,
                verify_turn=args.verify_turn,
            )
            checks.extend(_replay_check(record, k, i))
            store.append(f"{scenario}_task{k}.jsonl", record)
    finally:
        store.release()
    lines = [
        f"captured {len(jobs)} episodes of {scenario} from OpenEnv server {args.openenv} "
        f"in {time.perf_counter() - t0:.2f}s",
        *_replay_lines(checks),
    ]
    with open(out / "capture_log.txt", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n\n")
    print("\n".join(lines), file=sys.stderr)
    print(str(out))
    return 0
