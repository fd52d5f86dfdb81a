"""``echo-trl capture`` on local scenarios: which scenarios and tasks, which policy, the collection and its log.

:mod:`echo_trl.commands.capture` parses the command and owns the replay check; this module builds the
policy (``replay:``, ``model:`` or ``openai:``), runs the jobs through
:mod:`echo_trl.envs.awm.collect` on one bounded server pool, aligns sampled log-probs with the trainer's
tokenization (:mod:`echo_trl.tokens.sampled`) as each episode finishes, and returns the summary.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..data.prompt import DEFAULT_SYSTEM_PROMPT
from ..errors import EchoTrlError
from ..outputs import check_output_dir
from ..progress import progress


def scenario_names(args: argparse.Namespace, source) -> list[str]:
    names = list(args.scenario or [])
    if args.scenario_file:
        try:
            lines = Path(args.scenario_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise EchoTrlError(f"--scenario-file {args.scenario_file}: {exc.strerror or exc}") from None
        names += [ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()]
    if args.all_scenarios:
        names += source.list_scenarios()
    return list(dict.fromkeys(names))


def collect_local(
    args: argparse.Namespace, kind: str, target: str, on_record: Callable[[dict], None] | None = None
) -> tuple[dict, list[str], Path]:
    """Collect into ``--output``; returns the summary, the log lines and the output directory.

    ``on_record`` sees each finished record (aligned) before it is stored.
    """
    from ..envs.awm.collect import EpisodeStore, plan_jobs, pooled_runner, run_jobs, summarize, write_summary
    from ..envs.awm.policy import PolicyError, ReplayPolicy
    from ..envs.awm.pool import ServerPool
    from ..envs.awm.scenario import HUB_REPO_ID, ScenarioError, ScenarioSource

    policy, sampler, tokenizer = build_policy(args, kind, target)
    source = (
        ScenarioSource.from_dir(args.data)
        if args.data
        else ScenarioSource.from_hub(args.hub_repo or HUB_REPO_ID, revision=args.revision)
    )
    scenarios, not_runnable = [], []
    for name in scenario_names(args, source):
        scenario = source.load(name)
        try:
            scenario.require("env_code")
        except ScenarioError:
            if not args.all_scenarios:
                raise
            not_runnable.append(name)
            continue
        scenarios.append(scenario)
    tasks: dict[str, list[int]] = {}
    for sc in scenarios:
        ks = args.task_idx or (policy.tasks(sc.name) if isinstance(policy, ReplayPolicy) else range(len(sc.tasks)))
        for k in ks:
            sc.task(k)  # range check with a clear error before anything starts
        if ks:
            tasks[sc.name] = list(ks)
    if not tasks:
        raise PolicyError(
            "no task to play: "
            + ("the replay file has no scripts for these scenarios" if scenarios else "no scenario with server code")
        )
    out = check_output_dir(Path(args.output))
    store = EpisodeStore(out)
    store.acquire()
    try:
        store.check_settings(settings(args, tokenizer))
        done = store.done_keys()
        jobs = plan_jobs(tasks, lambda s, k: episodes_per_task(args, policy, s, k))
        todo = [j for j in jobs if j.key not in done]
        t0 = time.perf_counter()
        with ServerPool(
            args.max_servers or min(args.concurrency, 8),
            tool_timeout=args.tool_timeout,
            verifier_timeout=args.verifier_timeout,
            verifier_mode=args.verifier_mode,
            unsafe_no_sandbox=args.unsafe_no_sandbox,
        ) as pool:
            for sc in scenarios:
                if sc.name in tasks:
                    pool.add(sc)
            run = pooled_runner(
                pool,
                policy,
                verify_turn=args.verify_turn,
                format=args.format,
                stop_on_format_error=args.stop_on_format_error,
                sampler=sampler,
            )
            desc = f"capture {len(tasks)} scenario(s)"
            try:
                for record in progress(
                    run_jobs(todo, run, concurrency=args.concurrency), desc=desc, unit="episode", total=len(todo)
                ):
                    if tokenizer is not None:
                        align(args, tokenizer, record)
                    if on_record is not None:
                        on_record(record)
                    store.add(record)
            except PolicyError as exc:
                raise PolicyError(
                    f"{exc} ({store.written} episode(s) of this run kept in {out}: rerun the same command to continue)"
                ) from None
            containment, stats = pool.containment, pool.stats
        elapsed = time.perf_counter() - t0
        summary = summarize(list(store.records()))
    finally:
        store.release()
    summary["run"] = {
        "episodes": store.written,
        "already_there": len(jobs) - len(todo),
        "seconds": round(elapsed, 2),
        "episodes_per_s": round(store.written / elapsed, 3) if elapsed > 0 else None,
        "concurrency": args.concurrency,
        "server_starts": stats.starts,
    }
    write_summary(out, summary)
    lines = log_lines(args, source, tasks, not_runnable, summary, containment, tokenizer)
    one = len(stats.databases) == 1
    lines[1:1] = [f"database{'' if one else ' ' + name}: {report}" for name, report in sorted(stats.databases.items())]
    return summary, lines, out


def episodes_per_task(args: argparse.Namespace, policy, scenario: str, k: int) -> int:
    from ..envs.awm.policy import ReplayPolicy

    if args.episodes is not None:
        return args.episodes
    if isinstance(policy, ReplayPolicy) and policy.recorded:
        return max(1, policy.count(scenario, k))
    return 1


def settings(args: argparse.Namespace, tokenizer) -> dict:
    """What shapes the episodes (a rerun into the same output must keep them; concurrency and counts may change)."""
    keys = (
        "policy",
        "model",
        "format",
        "verify_turn",
        "system_prompt",
        "temperature",
        "top_p",
        "max_new_tokens",
        "max_steps",
        "seed",
        "stop_on_format_error",
        "verifier_mode",
        "logprobs",
    )
    return {**{k: getattr(args, k) for k in keys}, "tokenizer": getattr(tokenizer, "name_or_path", None)}


def log_lines(args, source, tasks, not_runnable, summary, containment, tokenizer) -> list[str]:
    from ..envs.awm.collect import summary_lines

    run = summary["run"]
    lp = summary["logprobs"]
    if not lp.get("turns"):
        align = "sampled log-probs: none (this policy samples nothing)"
    elif not lp.get("turns_with_logprobs"):
        align = "sampled log-probs: the server returned no token ids / log-probs: no behavior_logprobs written"
    elif tokenizer is None:
        align = "sampled log-probs NOT aligned (no tokenizer: give --tokenizer): no behavior_logprobs written"
    else:
        align = f"sampled log-probs compared with the tokenization of {tokenizer.name_or_path!r}"
    return [
        f"source: {source!r}",
        f"policy: {args.policy}" + (f" (model {args.model})" if args.model else ""),
        f"scenarios: {len(tasks)}" + (f" ({', '.join(tasks)})" if len(tasks) <= 8 else ""),
        *([f"scenarios without server code (skipped): {', '.join(not_runnable)}"] if not_runnable else []),
        f"format: {args.format}; verifier turn: {args.verify_turn}; format errors: "
        f"{'end the episode' if args.stop_on_format_error else 'the episode goes on'}",
        f"this run: {run['episodes']} episodes in {run['seconds']}s ({run['episodes_per_s']} episodes/s, "
        f"concurrency {run['concurrency']}); {run['already_there']} were already in the output",
        *summary_lines(summary),
        align,
        f"containment: {'; '.join(containment.applied())}",
        f"containment notes: {'; '.join(containment.notes) or '-'}",
        f"unsafe-no-sandbox: {'yes (generated code ran uncontained)' if args.unsafe_no_sandbox else 'no'}",
    ]


def build_policy(args: argparse.Namespace, kind: str, target: str):
    """(policy, sampler description, tokenizer to align log-probs with or None)."""
    from ..envs.awm.policy import ReplayPolicy

    if kind == "replay":
        return ReplayPolicy.from_file(target), None, None
    if kind == "model":
        policy = model_policy(args, target)
        return policy, None, policy.tokenizer
    from ..envs.awm.openai_policy import OpenAIClient, OpenAIPolicy
    from ..tokens.sampled import load_tokenizer

    if not args.model:
        raise EchoTrlError("--policy openai:URL needs --model (the name the server serves the model under)")
    client = OpenAIClient(
        target,
        args.model,
        api_key=os.environ.get(args.api_key_env) or None,
        timeout=args.request_timeout,
        max_retries=args.max_retries,
        backoff=args.retry_backoff,
        logprobs=args.logprobs,
    )
    policy = OpenAIPolicy(
        client,
        format=args.format,
        max_steps=args.max_steps,
        max_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        system_prompt=args.system_prompt or None,  # as the builder reads it (awm-agent: the default is the official)
        seed=args.seed,
    )
    tokenizer = None
    if args.logprobs != "off":
        try:
            tokenizer = load_tokenizer(args.tokenizer or args.model, trust_remote_code=args.trust_remote_code)
        except EchoTrlError:
            if args.tokenizer:
                raise
    sampler = {"server": client.base, "model": args.model, "temperature": args.temperature, "top_p": args.top_p}
    return policy, sampler, tokenizer


def align(args: argparse.Namespace, tokenizer, record: dict) -> None:
    from ..tokens.sampled import align_record, apply_alignment

    alignment = align_record(
        tokenizer,
        record,
        format=args.format,
        verify_turn=args.verify_turn,
        system_prompt=args.system_prompt or None,
    )
    apply_alignment(record, alignment, tokenizer.name_or_path)


def model_policy(args: argparse.Namespace, target: str):
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
