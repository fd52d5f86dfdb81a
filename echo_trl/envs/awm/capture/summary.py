"""What a collection holds, summed up: the summary a person checks before training on the episodes.

:func:`summarize` reads the records back (episodes, reward mean per scenario, outcomes, format and tool
errors, tokens, log-prob alignment, and the episodes that teach little: empty, without a tool call, cut at the
token limit); :func:`summary_lines` prints it, with a warning line when such episodes are there (a server whose
replies are all empty otherwise yields a collection, then a training run, that look fine and train nothing);
:func:`write_summary` keeps it as ``capture_summary.json`` beside the episodes.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ....data.readers.records import sampled_turns
from ....io.atomic import write_file
from ..scenario.rewards import FORMAT_ERRORS

SUMMARY_FILE = "capture_summary.json"
#: Step outcomes counted as tool errors (the environment refused or failed a well-formed call).
TOOL_ERRORS = ("tool_error", "server_error", "timeout")
#: The recorded step that runs the verifier (every other step is a tool call of the policy).
VERIFY_STEP = "verify"


def final_answer(record: dict[str, Any]) -> str:
    """The answer the policy ended its episode with ("" when none): the verifier step's ``final_answer``."""
    if isinstance(record.get("final_answer"), str):
        return record["final_answer"]
    steps = [*(record.get("steps") or []), *([record["verification"]] if "verification" in record else [])]
    for step in reversed(steps):
        action = step.get("action") or {}
        if action.get("tool_name") == VERIFY_STEP:
            answer = (action.get("arguments") or {}).get("final_answer")
            return answer if isinstance(answer, str) else ""
    return ""


def episode_quality(record: dict[str, Any]) -> dict[str, int]:
    """What makes one episode teach little: no tool call (no environment output to learn), empty (no tool call
    and an empty final answer: nothing at all), and its sampled turns cut at the token limit
    (``finish_reason == "length"``)."""
    calls = [s for s in record.get("steps") or [] if (s.get("action") or {}).get("tool_name") != VERIFY_STEP]
    cut = sum(1 for turn in sampled_turns(record) if turn.get("finish_reason") == "length")
    return {
        "without_tool_call": int(not calls),
        "empty": int(not calls and not final_answer(record).strip()),
        "turns_at_token_limit": cut,
        "episodes_at_token_limit": int(cut > 0),
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over collected records: what a person checks before training on them.

    Per scenario: episodes and reward mean. Outcomes (``reward_type``), format errors (unknown tool,
    invalid arguments) and tool errors (the environment refused or failed a call) over all steps,
    tokens the server reported (prompt and completion), and the sampler log-prob alignment: turns
    with token ids and log-probs, turns aligned with the trainer's tokenization, turns flagged, and
    episodes that carry ``behavior_logprobs``.
    """
    by_scenario: dict[str, list[float]] = defaultdict(list)
    outcomes: Counter[str] = Counter()
    steps: Counter[str] = Counter()
    tokens = Counter()
    align = Counter()
    quality: Counter[str] = Counter()
    verify_only: Counter[str] = Counter()
    for rec in records:
        quality.update(episode_quality(rec))
        if only_verified(rec):
            verify_only[rec.get("reward_type", "?")] += 1
        by_scenario[rec.get("scenario", "?")].append(float(rec.get("reward", 0.0)))
        outcomes[rec.get("reward_type", "?")] += 1
        for step in [*rec.get("steps", []), *([rec["verification"]] if "verification" in rec else [])]:
            steps[step.get("observation", {}).get("reward_type", "?")] += 1
        sampler = rec.get("sampler") or {}
        turns = sampled_turns(rec)
        for turn in turns:
            usage = turn.get("usage") or {}
            tokens["prompt"] += int(usage.get("prompt_tokens", 0))
            tokens["completion"] += int(usage.get("completion_tokens", 0))
        align["turns"] += len(turns)
        align["turns_with_logprobs"] += sum(1 for t in turns if t.get("logprobs") is not None and t.get("token_ids"))
        checked = sampler.get("alignment") or {}
        align["turns_aligned"] += int(checked.get("aligned_turns", 0))
        align["turns_flagged"] += len(checked.get("flagged") or [])
        align["episodes_with_behavior_logprobs"] += rec.get("behavior_logprobs") is not None
    n = sum(len(v) for v in by_scenario.values())
    return {
        "episodes": n,
        "scenarios": {
            s: {"episodes": len(v), "reward_mean": round(sum(v) / len(v), 4)} for s, v in sorted(by_scenario.items())
        },
        "reward_mean": round(sum(sum(v) for v in by_scenario.values()) / n, 4) if n else None,
        "outcomes": dict(sorted(outcomes.items())),
        "steps": sum(steps.values()),
        "format_errors": sum(steps[k] for k in FORMAT_ERRORS),
        "tool_errors": sum(steps[k] for k in TOOL_ERRORS),
        "tokens": {"prompt": tokens["prompt"], "completion": tokens["completion"]},
        "logprobs": dict(align),
        "quality": {
            k: quality[k] for k in ("empty", "without_tool_call", "episodes_at_token_limit", "turns_at_token_limit")
        },
        "verify_only": {"episodes": sum(verify_only.values()), "outcomes": dict(sorted(verify_only.items()))},
    }


def only_verified(record: dict[str, Any]) -> bool:
    """The episode's only action on the environment was the verifier: no tool call before it.

    Such a rollout is judged on the untouched initial database; one that scores ``complete`` means the task
    rewards doing nothing (``echo-trl check-scenarios`` reports the task ``already_satisfied``). The verifier
    step is the harness's (its observation, in upstream's shape, names no tool), in ``steps`` or ``verification``.
    """
    steps = record.get("steps") or []
    verifier = [s for s in steps if _is_verifier_step(s)]
    return len(verifier) == len(steps) and bool(verifier or record.get("verification"))


def _is_verifier_step(step: Any) -> bool:
    return (
        isinstance(step, dict)
        and (step.get("action") or {}).get("tool_name") == "verify"
        and "tool_name" not in (step.get("observation") or {})
    )


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as the lines ``capture`` prints and logs."""
    lp = summary["logprobs"]
    lines = [
        f"episodes: {summary['episodes']} (reward mean {summary['reward_mean']})",
        *(
            f"  {name}: {s['episodes']} episodes, reward mean {s['reward_mean']}"
            for name, s in summary["scenarios"].items()
        ),
        f"outcomes: {json.dumps(summary['outcomes'], sort_keys=True)}",
        f"steps: {summary['steps']}; format errors: {summary['format_errors']}; tool errors: {summary['tool_errors']}",
        f"tokens: prompt {summary['tokens']['prompt']}, completion {summary['tokens']['completion']}",
    ]
    only = summary.get("verify_only") or {"episodes": 0}
    if only["episodes"]:
        lines.append(
            f"episodes that only called verify (no tool call): {only['episodes']}, outcomes "
            f"{json.dumps(only['outcomes'], sort_keys=True)}"
            + (
                "; 'complete' ones reward doing nothing (`echo-trl check-scenarios` names such tasks)"
                if only["outcomes"].get("complete")
                else ""
            )
        )
    if lp.get("turns"):
        lines.append(
            f"sampled turns: {lp['turns']}, with token ids and log-probs {lp.get('turns_with_logprobs', 0)}, "
            f"aligned with the trainer's tokenization {lp.get('turns_aligned', 0)}, "
            f"FLAGGED (reasons under sampler.alignment) {lp.get('turns_flagged', 0)}; "
            f"episodes with behavior_logprobs: {lp.get('episodes_with_behavior_logprobs', 0)}"
        )
    q, n = summary.get("quality") or {}, summary["episodes"]
    if q:
        lines.append(
            f"episodes without a tool call: {q['without_tool_call']}; empty (no tool call, empty answer): "
            f"{q['empty']}; with a turn cut at the token limit: {q['episodes_at_token_limit']} "
            f"({q['turns_at_token_limit']} turns)"
        )
        warning = quality_warning(q, n)
        if warning:
            lines.append(warning)
    return lines


def quality_warning(quality: dict[str, int], episodes: int) -> str | None:
    """One line when episodes teach little (``None`` when none does): how many, and what to check."""
    parts = [
        f"{quality[key]} of {episodes} episodes {what}"
        for key, what in (
            ("empty", "are empty (no tool call, empty answer)"),
            ("without_tool_call", "have no tool call (no environment output to learn)"),
            ("episodes_at_token_limit", "have a reply cut at the token limit"),
        )
        if quality.get(key)
    ]
    if not parts:
        return None
    return (
        "WARNING: " + "; ".join(parts) + ": check the policy's replies (--max_new_tokens, chat template, tool-call "
        "parser of the server) before training on them"
    )


def write_summary(out: Path, summary: dict[str, Any]) -> Path:
    path = out / SUMMARY_FILE
    write_file(path, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path
