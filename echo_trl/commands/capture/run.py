"""``echo-trl capture`` on local scenarios: which scenarios and tasks, which policy, the collection and its log.

:mod:`echo_trl.commands.capture.command` parses the command and owns the replay check; this module builds the
policy (``replay:``, ``model:`` or ``openai:``) and the library's typed ``CollectionSettings`` from the parsed
:class:`~echo_trl.commands.capture.args.CaptureArguments`, runs the collection with
:func:`echo_trl.envs.awm.capture.run.collect` on one bounded server pool, aligns sampled log-probs with the trainer's
tokenization (:mod:`echo_trl.tokens.sampled`) as each episode finishes, and returns the summary.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ...data.readers.prompt import DEFAULT_SYSTEM_PROMPT
from ...errors import EchoTrlError
from ...redact import redact
from .args import CaptureArguments


def scenario_names(args: CaptureArguments, source) -> list[str]:
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
    args: CaptureArguments, on_record: Callable[[dict], None] | None = None
) -> tuple[dict, list[str], Path]:
    """Collect into ``--output``; returns the summary, the log lines and the output directory.

    ``on_record`` sees each finished record (aligned) before it is stored.
    """
    from ...envs.awm.capture.run import collect
    from ...envs.awm.scenario.source import HUB_REPO_ID, ScenarioSource

    policy, sampler, tokenizer = build_policy(args)
    source = (
        ScenarioSource.from_dir(args.data)
        if args.data
        else ScenarioSource.from_hub(args.hub_repo or HUB_REPO_ID, revision=args.revision)
    )

    def finished(record: dict) -> None:
        if tokenizer is not None:
            align(args, tokenizer, record)
        if on_record is not None:
            on_record(record)

    result = collect(
        collection_settings(args, scenario_names(args, source), tokenizer),
        source,
        policy,
        sampler=sampler,
        on_record=finished,
    )
    lines = log_lines(args, source, result.tasks, result.not_runnable, result.summary, result.containment, tokenizer)
    one = len(result.databases) == 1
    lines[1:1] = [
        f"database{'' if one else ' ' + name}: {report}" for name, report in sorted(result.databases.items())
    ]
    lines[1:1] = result.skipped
    return result.summary, lines, result.output


def collection_settings(args: CaptureArguments, scenarios: list[str], tokenizer):
    """The library's typed settings of this collection, from the parsed flags (the library never sees them)."""
    from ...envs.awm.capture.run import CollectionSettings
    from ...envs.awm.runtime.settings import AWMSettings

    return CollectionSettings(
        output=Path(args.output),
        scenarios=tuple(scenarios),
        skip_without_server_code=args.all_scenarios,
        task_indices=tuple(args.task_idx or ()),
        episodes=args.episodes,
        concurrency=args.concurrency,
        format=args.format,
        verify_turn=args.verify_turn,
        environment=AWMSettings(
            tool_timeout=args.tool_timeout,
            verifier_timeout=args.verifier_timeout,
            verifier_mode=args.verifier_mode,
            unsafe_no_sandbox=args.unsafe_no_sandbox,
            stop_on_format_error=args.stop_on_format_error,
        ),
        max_servers=args.max_servers,
        shaping=settings(args, tokenizer),
        scenario_report=args.scenario_report,
        check=args.check,
        include_unusable=args.include_unusable,
    )


def episodes_per_task(args: CaptureArguments, policy, scenario: str, k: int) -> int:
    from ...envs.awm.capture.run import episodes_for

    return episodes_for(policy, args.episodes, scenario, k)


def settings(args: CaptureArguments, tokenizer) -> dict:
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
        "chat_template_path",
    )
    return {**{k: getattr(args, k) for k in keys}, "tokenizer": getattr(tokenizer, "name_or_path", None)}


def log_lines(args, source, tasks, not_runnable, summary, containment, tokenizer) -> list[str]:
    from ...envs.awm.capture.summary import summary_lines

    run = summary["run"]
    lp = summary["logprobs"]
    if not lp.get("turns"):
        align = "sampled log-probs: none (this policy samples nothing)"
    elif not lp.get("turns_with_logprobs"):
        align = "sampled log-probs: the server returned no token ids / log-probs: no behavior_logprobs written"
    elif tokenizer is None:
        align = (
            f"sampled log-probs NOT aligned (no local tokenizer for --model {args.model}: give --tokenizer "
            "PATH_OR_ID, or --tokenizer_from_hub): no behavior_logprobs written"
        )
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
        *(f"repaired: {r}" for r in run.get("repaired", [])),
        *summary_lines(summary),
        align,
        f"containment: {'; '.join(containment.applied())}",
        f"containment notes: {'; '.join(containment.notes) or '-'}",
        f"unsafe-no-sandbox: {'yes (generated code ran uncontained)' if args.unsafe_no_sandbox else 'no'}",
    ]


def build_policy(args: CaptureArguments):
    """(policy, sampler description, tokenizer to align log-probs with or None) of ``--policy KIND:TARGET``."""
    from ...envs.awm.policies.replay import ReplayPolicy

    kind, target = args.policy_kind, args.policy_target
    if kind == "replay":
        return ReplayPolicy.from_file(target), None, None
    if kind == "model":
        policy = model_policy(args, target)
        return policy, None, policy.tokenizer
    from ...clients.openai import OpenAIClient
    from ...envs.awm.policies.openai import OpenAIPolicy
    from ...tokens.sampled import load_tokenizer
    from ...tokens.template.chat_template import apply_chat_template_path

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
        max_response_bytes=args.max_response_bytes,
        key_source=f"the API key in ${args.api_key_env}",
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
        try:  # --model is the server's name for the model: looked up on the Hub only when asked
            tokenizer = load_tokenizer(
                args.tokenizer or args.model,
                trust_remote_code=args.trust_remote_code,
                local_files_only=not (args.tokenizer or args.tokenizer_from_hub),
            )
            apply_chat_template_path(tokenizer, args.chat_template_path, trust_remote_code=args.trust_remote_code)
        except EchoTrlError:
            if args.tokenizer:
                raise
    if tokenizer is not None:
        from ...tokens.size_limit import set_max_rendered_chars

        set_max_rendered_chars(tokenizer, args.max_rendered_chars)
    sampler = {
        "server": redact(client.base),
        "model": args.model,
        "temperature": args.temperature,
        "top_p": args.top_p,
    }
    return policy, sampler, tokenizer


def align(args: CaptureArguments, tokenizer, record: dict) -> None:
    """Align the record's sampled turns (``behavior_logprobs`` or flagged turns). An episode that cannot be
    rendered for the comparison (over ``--max_rendered_chars``, a field the dataset builder refuses) is kept,
    flagged with the reason, without log-probs: one episode never stops the run."""
    from ...tokens.sampled import Alignment, TurnCheck, align_record, apply_alignment

    try:
        alignment = align_record(
            tokenizer,
            record,
            format=args.format,
            verify_turn=args.verify_turn,
            system_prompt=args.system_prompt or None,
        )
    except (EchoTrlError, RecursionError) as exc:
        why = redact(" ".join(str(exc).split())[:500]) or type(exc).__name__
        alignment = Alignment("flagged", [TurnCheck(0, False, f"the episode could not be aligned: {why}")])
    apply_alignment(record, alignment, tokenizer.name_or_path)


def model_policy(args: CaptureArguments, target: str):
    from ...envs.awm.policies.model import AWMAgentModelPolicy, ModelPolicy

    system_prompt = args.system_prompt or None
    if args.format == "awm-agent":
        cls = AWMAgentModelPolicy
        system_prompt = None if args.system_prompt == DEFAULT_SYSTEM_PROMPT else system_prompt
    else:
        cls = ModelPolicy
    from ...tokens.template.chat_template import apply_chat_template_path

    def prepare(tokenizer):  # before the policy checks the template can call tools
        return apply_chat_template_path(tokenizer, args.chat_template_path, trust_remote_code=args.trust_remote_code)

    return cls.from_pretrained(
        target,
        trust_remote_code=args.trust_remote_code,
        prepare_tokenizer=prepare,
        max_steps=args.max_steps,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        system_prompt=system_prompt,
    )
