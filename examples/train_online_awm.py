"""Online ECHO against live Agent World Model (AWM) environments.

TRL generates the agent's turns (locally, or on a vLLM server with ``--use_vllm --vllm_mode server``);
each rollout gets its own AWM environment (its own copy of the scenario's SQLite database, served by
the scenario's generated MCP server, sandboxed), built by
:func:`echo_trl.envs.awm.online.environment.awm_environment_factories` and passed to
``EchoGRPOTrainer(environment_factory=...)``. Several ``--awm_scenario`` names train over several
scenarios in one run: each prompt row goes to its scenario's environment, servers start when first
needed and at most ``--awm_max_servers`` live at once (least recently used closed first). The
reward is the scenario's verifier; ECHO adds ``world_model_coeff`` x cross-entropy on the tool
outputs TRL appended to the conversation. ``--awm_format awm-agent`` trains in the official AWM
agent's conversation (its system prompt; exactly two tools, ``list_tools`` and ``call_tool``, for
every scenario: :mod:`echo_trl.envs.awm.online.agent`), the format the Arctic-AWM models learned.

Every ``echo-trl train`` flag (``EchoGRPOConfig`` and TRL's ``ModelConfig``, ``--config YAML``,
``--use_peft``) works here; the AWM flags below replace ``--dataset_name`` (the prompts are the
scenario's tasks). ``path/to/awm1k_samples`` below stands for a directory of AWM-1K files
(``gen_*.jsonl``, from the Hub dataset ``Snowflake/AgentWorldModel-1K``) holding ``content_platform_1``.
``--awm_scenario_report`` (a report of ``echo-trl check-scenarios``) or ``--awm_check`` leaves out the
scenarios and tasks the check marks unusable, e.g. a task whose untouched database already passes its
verifier (a rollout that does nothing would score "complete"); ``--awm_include_unusable`` keeps them.

    python examples/train_online_awm.py --model_name_or_path Qwen/Qwen3-0.6B \\
        --awm_data data/awm_scenarios --awm_scenario library_1 --output_dir runs/online \\
        --num_generations 4 --per_device_train_batch_size 4 --max_completion_length 1024

    python examples/train_online_awm.py --model_name_or_path Qwen/Qwen3-0.6B \\
        --awm_data data/awm_scenarios path/to/awm1k_samples \\
        --awm_scenario library_1 content_platform_1 --awm_max_servers 4 --output_dir runs/online2 \\
        --num_generations 4 --per_device_train_batch_size 8 --max_completion_length 1024

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero3.yaml \\
        examples/train_online_awm.py --config examples/configs/qwen3_8b_zero3_vllm_online.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class AWMOnlineArguments:
    """Where the AWM scenario and its tasks come from (the prompts of online training)."""

    awm_scenario: list[str] | None = field(
        default=None, metadata={"help": "AWM scenario name(s), e.g. library_1 (several: one run over all of them)."}
    )
    awm_data: list[str] | None = field(
        default=None,
        metadata={
            "help": "Local AWM-format directory (or several) with gen_*.jsonl files (e.g. "
            "data/awm_scenarios); each scenario is read from the first directory that has it."
        },
    )
    awm_hub_repo: str | None = field(
        default=None,
        metadata={
            "help": "Read the scenario from this Hub dataset instead of --awm_data "
            "(e.g. Snowflake/AgentWorldModel-1K); --awm_data wins when both are set."
        },
    )
    awm_tasks: list[int] | None = field(
        default=None,
        metadata={
            "help": "Task indices to train on (in every scenario). Default: each scenario's "
            "'train' tasks from splits.json next to its data when present, else every task."
        },
    )
    awm_repeats: int = field(default=1, metadata={"help": "Rows per task in the prompt dataset (an epoch's size)."})
    awm_tool_timeout: float = field(default=30.0, metadata={"help": "Seconds one MCP tool call may take."})
    awm_verifier_timeout: float = field(default=30.0, metadata={"help": "Seconds the task verifier may take."})
    awm_max_servers: int = field(
        default=4,
        metadata={"help": "Scenario server processes alive at once (a pool; least recently used closed first)."},
    )
    awm_format: str = field(
        default="chat-template",
        metadata={
            "help": "chat-template: one tool per MCP tool, the chat template's tool "
            "calls; awm-agent: the official AWM agent's list_tools/call_tool.",
            "choices": ["chat-template", "awm-agent"],
        },
    )
    awm_verify_turn: str | None = field(
        default=None,
        metadata={
            "help": "env_output (default with chat-template): the agent gets a "
            "verify(final_answer) tool whose result enters the conversation; omit (default and "
            "only choice with awm-agent): the verifier runs after the rollout, unseen.",
            "choices": ["env_output", "omit"],
        },
    )
    awm_stop_on_format_error: bool = field(
        default=False,
        metadata={
            "help": "End a rollout at its first format error (default: go on as AWM does; the "
            "reward is -1.0 either way)."
        },
    )
    awm_system_prompt: str | None = field(
        default=None,
        metadata={
            "help": "System prompt of every task ('{scenario}' is filled in, other braces are "
            "text; default: echo-trl's, or the official agent's with awm-agent)."
        },
    )
    awm_scenario_report: str | None = field(
        default=None,
        metadata={
            "help": "Report of `echo-trl check-scenarios` (its JSON file or output directory): the scenarios and "
            "tasks it marks unusable (a database or server that fails, a broken verifier, a task whose untouched "
            "database already passes) are left out."
        },
    )
    awm_check: bool = field(
        default=False,
        metadata={
            "help": "Check the scenarios first (`echo-trl check-scenarios`, into OUTPUT_DIR/scenario_check) and "
            "leave out what the check marks unusable."
        },
    )
    awm_include_unusable: bool = field(
        default=False,
        metadata={"help": "Train on the scenarios and tasks the scenario report marks unusable too (still listed)."},
    )


def make_parser():
    """``echo-trl train``'s parser (EchoGRPOConfig + ModelConfig) with the AWM arguments instead of datasets."""
    from trl import ModelConfig, TrlParser

    from echo_trl.config import EchoGRPOConfig

    return TrlParser(
        (AWMOnlineArguments, EchoGRPOConfig, ModelConfig),
        prog="train_online_awm.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _as_list(value) -> list[str]:
    """A list flag's value (a YAML config may give one string)."""
    return [value] if isinstance(value, str) else list(value or [])


def train_tasks(
    awm_args: AWMOnlineArguments, scenario: str | None = None, data_dir: str | None = None
) -> list[int] | None:
    """The explicit task list, else the 'train' split of ``splits.json`` beside the scenario's data, else all (None).

    ``scenario`` / ``data_dir`` default to the first ``--awm_scenario`` / ``--awm_data``.
    """
    if awm_args.awm_tasks:
        return list(awm_args.awm_tasks)
    scenario = scenario or (_as_list(awm_args.awm_scenario) or [None])[0]
    data_dir = data_dir or (_as_list(awm_args.awm_data) or [None])[0]
    if data_dir:
        splits = Path(data_dir) / "splits.json"
        if splits.is_file():
            spec = json.loads(splits.read_text(encoding="utf-8")).get(scenario, {})
            if spec.get("train"):
                return [int(k) for k in spec["train"]]
    return None


def load_scenarios(awm_args: AWMOnlineArguments) -> list[tuple[object, str | None]]:
    """(Scenario, its data directory or None for the Hub) for every --awm_scenario."""
    from echo_trl.envs.awm.scenario.source import ScenarioSource
    from echo_trl.errors import EchoTrlError

    dirs = _as_list(awm_args.awm_data)
    sources = [(ScenarioSource.from_dir(d), d) for d in dirs] or [
        (ScenarioSource.from_hub(awm_args.awm_hub_repo), None)
    ]
    out = []
    for name in _as_list(awm_args.awm_scenario):
        where = next(
            ((src, d) for src, d in sources if d is None or name in src.list_scenarios()),
            sources[0] if len(sources) == 1 else None,
        )  # one source: its load() says what is missing
        if where is None:
            raise EchoTrlError(f"scenario {name!r} is in none of --awm_data {dirs}")
        out.append((where[0].load(name), where[1]))
    return out


def scenario_report(awm_args: AWMOnlineArguments, scenarios: list[tuple[object, str | None]], output_dir: str):
    """The scenario report to screen with: ``--awm_scenario_report``, or a check run now (``--awm_check``)."""
    from echo_trl.envs.awm.check.run import CheckSettings, check_scenarios
    from echo_trl.envs.awm.check.usable import ScenarioReport
    from echo_trl.envs.awm.scenario.source import ScenarioSource

    if awm_args.awm_scenario_report:
        return ScenarioReport.load(awm_args.awm_scenario_report)
    if not awm_args.awm_check:
        return None
    results = {}
    for i, data_dir in enumerate(dict.fromkeys(d for _, d in scenarios)):  # one check per data directory
        source = ScenarioSource.from_dir(data_dir) if data_dir else ScenarioSource.from_hub(awm_args.awm_hub_repo)
        names = tuple(sc.name for sc, d in scenarios if d == data_dir)
        settings = CheckSettings(output=Path(output_dir) / "scenario_check" / str(i), scenarios=names)
        results.update(ScenarioReport.from_report(check_scenarios(source, settings)).results)
    return ScenarioReport(str(Path(output_dir) / "scenario_check"), results)


def main(argv: list[str] | None = None) -> int:
    from trl import get_peft_config, get_quantization_config

    from echo_trl.data.readers import awm_agent
    from echo_trl.data.readers.formats import default_verify_turn
    from echo_trl.envs.awm.check.usable import usable_selection
    from echo_trl.envs.awm.online.agent import awm_agent_environment_factory
    from echo_trl.envs.awm.online.dataset import awm_task_dataset
    from echo_trl.envs.awm.online.environment import awm_environment_factories, close_environments
    from echo_trl.errors import EchoTrlError
    from echo_trl.trainer import EchoGRPOTrainer

    awm_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    if not model_args.model_name_or_path or not awm_args.awm_scenario:
        raise EchoTrlError("--model_name_or_path and --awm_scenario are required")
    if not awm_args.awm_data and not awm_args.awm_hub_repo:
        raise EchoTrlError("give --awm_data DIR or --awm_hub_repo REPO (--awm_data wins when both are set)")
    scenarios = load_scenarios(awm_args)
    tasks = {sc.name: train_tasks(awm_args, sc.name, d) for sc, d in scenarios}
    report = scenario_report(awm_args, scenarios, training_args.output_dir)
    if report is not None:  # leave out what the report marks unusable, saying what and why
        _, tasks, skipped = usable_selection(
            report, [sc for sc, _ in scenarios], tasks, include_unusable=awm_args.awm_include_unusable
        )
        for line in skipped.lines(hint="--awm_include_unusable"):
            print(f"train_online_awm.py: scenario report: {line}", file=sys.stderr)
        scenarios = [(sc, d) for sc, d in scenarios if sc.name in tasks]
        if not scenarios:
            raise EchoTrlError("the scenario report marks every scenario and task asked for unusable")
    several = len(scenarios) > 1
    agent = awm_args.awm_format == "awm-agent"
    system_prompt = awm_args.awm_system_prompt or (awm_agent.SYSTEM_PROMPT if agent else None)
    prompts = awm_task_dataset(
        [sc for sc, _ in scenarios] if several else scenarios[0][0],
        tasks if several else tasks[scenarios[0][0].name],
        repeats=awm_args.awm_repeats,
        system_prompt=system_prompt,
    )
    env_kwargs = {
        "tool_timeout": awm_args.awm_tool_timeout,
        "verifier_timeout": awm_args.awm_verifier_timeout,
        "max_servers": awm_args.awm_max_servers,
        "stop_on_format_error": awm_args.awm_stop_on_format_error,
        "verify_turn": awm_args.awm_verify_turn or default_verify_turn(awm_args.awm_format),
        "scenario_report": report,  # the environments also refuse a row of an unusable task
        "include_unusable": awm_args.awm_include_unusable,
    }
    if agent:  # one environment for every scenario: the row's 'scenario' picks it
        factory = awm_agent_environment_factory([sc for sc, _ in scenarios], **env_kwargs)
    else:
        factories = awm_environment_factories([sc for sc, _ in scenarios], **env_kwargs)
        factory = factories if several else next(iter(factories.values()))
    training_args.model_init_kwargs = {
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        "revision": model_args.model_revision,
        **(training_args.model_init_kwargs or {}),
    }
    try:
        trainer = EchoGRPOTrainer(
            model=model_args.model_name_or_path,
            args=training_args,
            train_dataset=prompts,
            environment_factory=factory,
            peft_config=get_peft_config(model_args),
            quantization_config=get_quantization_config(model_args),
        )
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_state()
        trainer.save_model(training_args.output_dir)
    finally:
        close_environments()
    return 0


if __name__ == "__main__":
    from echo_trl.errors import EchoTrlError

    try:
        sys.exit(main())
    except EchoTrlError as exc:
        print(f"train_online_awm.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
