"""``echo-trl check-scenarios``: is an AWM-1K directory (or the Hub dataset) fit to collect from and train on?"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..command_line import CommandParser, FlagValueError, command_parser, parse_command, positive_int, positive_number
from ..data.hub import load_failure, locate

DESCRIPTION = """\
Check every AWM scenario of DATA before collecting episodes or training on it. Per scenario: the
database is built (statements that fail are named), the server starts (contained) and lists its
tools, and the verifier code of both modes compiles. Per task, its code verifier runs against the
untouched initial database (what a rollout that only calls `verify` is judged on):

  ok                 it runs and does not pass
  already_satisfied  it passes: an agent that does nothing scores "complete" (GRPO would reward that)
  verifier_error     it does not compile, raises, hangs or returns no verdict
  no_verifier        the dataset has no code verifier for the task
  not_checked        no initial database to run it on

Results go to OUTPUT/scenario_check.jsonl as each scenario finishes: a rerun with the same --output
reuses the results of unchanged scenarios and checks the rest. The report (OUTPUT/scenario_report.json;
everything but its `run` part is the same on every rerun) feeds `echo-trl capture --scenario_report`,
which then skips unusable scenarios and tasks. DATA is a directory of AWM-1K gen_*.jsonl files or a
Hub dataset id (Snowflake/AgentWorldModel-1K, read through the local Hugging Face cache)."""

EPILOG = """\
examples:
  echo-trl check-scenarios data/awm_scenarios --output outputs/check
  echo-trl check-scenarios path/to/awm1k --scenario e_commerce_33 code_hosting_2 --output outputs/check
  echo-trl check-scenarios Snowflake/AgentWorldModel-1K --concurrency 8 --output outputs/awm1k_check --json"""


@dataclass
class CheckScenariosArguments:
    """Flags of ``echo-trl check-scenarios`` (the data is its positional argument).

    Parameters:
        > Parameters that control what is checked

        scenario (`list[str]` or `None`, *optional*):
            Scenario names to check; default: every scenario DATA has tasks for.
        revision (`str` or `None`, *optional*):
            Hub revision when DATA is a Hub dataset id.
        verifier_timeout (`float`, *optional*, defaults to `30.0`):
            Seconds each verifier run may take (longer is a ``verifier_error``).

        > Parameters that control how

        output (`str`, *optional*, defaults to `"scenario_check"`):
            Output directory: results, the report; a rerun with the same one reuses unchanged scenarios' results.
        concurrency (`int`, *optional*, defaults to `4`):
            Scenarios checked at once (each with at most one server), and verifier processes at once.
        unsafe_no_sandbox (`bool`, *optional*, defaults to `False`):
            Run the generated server and verifier code without the bubblewrap sandbox (only for code you trust).
        json (`bool`, *optional*, defaults to `False`):
            Print the report as one JSON object on stdout and nothing else there.
    """

    scenario: list[str] | None = field(
        default=None, metadata={"help": "scenario name(s) to check (default: every scenario with tasks)"}
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision (DATA a Hub dataset id)"})
    verifier_timeout: float = field(
        default=30.0, metadata={"help": "seconds each verifier run may take (longer: verifier_error; default 30)"}
    )
    output: str = field(
        default="scenario_check",
        metadata={
            "help": "output directory: per-scenario results and scenario_report.json; a rerun with the same one "
            "reuses the results of unchanged scenarios (default: scenario_check)",
            "metavar": "DIR",
        },
    )
    concurrency: int = field(
        default=4, metadata={"help": "scenarios checked at once, and verifier processes at once (default 4)"}
    )
    unsafe_no_sandbox: bool = field(
        default=False,
        metadata={"help": "run the generated server and verifier code WITHOUT the bubblewrap sandbox"},
    )
    json: bool = field(default=False, metadata={"help": "print the report as one JSON object on stdout"})

    def __post_init__(self) -> None:
        positive_int("concurrency", self.concurrency)
        positive_number("verifier_timeout", self.verifier_timeout)
        if self.scenario is not None and any(not s.strip() for s in self.scenario):
            raise FlagValueError("argument --scenario: expected scenario names, got an empty one")


def make_parser() -> CommandParser:
    parser = command_parser(
        "echo-trl check-scenarios",
        [CheckScenariosArguments],
        usage="echo-trl check-scenarios DATA [--scenario NAME ...] [--output DIR] [--config YAML] [FLAGS...]",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    parser.add_argument("data", metavar="DATA", help="a directory of AWM-1K gen_*.jsonl files, or a Hub dataset id")
    return parser


def parse_args(argv: list[str]) -> tuple[str, CheckScenariosArguments]:
    """The data and the flags."""
    args, positional = parse_command(make_parser(), argv)
    return positional.data, args


def scenario_source(data: str, revision: str | None = None):
    """DATA as capture reads ``--data`` / ``--hub``: a local directory of gen_*.jsonl files, else a Hub dataset."""
    from ..envs.awm.scenario.source import ScenarioSource

    if locate(data, "DATA") == "local":
        return ScenarioSource.from_dir(data)
    return ScenarioSource.from_hub(data, revision=revision)


def main(argv: list[str]) -> int:
    from ..envs.awm.check.report import report_lines
    from ..envs.awm.check.run import CheckSettings, check_scenarios

    data, args = parse_args(argv)
    settings = CheckSettings(
        output=Path(args.output),
        scenarios=tuple(args.scenario or ()),
        concurrency=args.concurrency,
        verifier_timeout=args.verifier_timeout,
        unsafe_no_sandbox=args.unsafe_no_sandbox,
    )
    source = scenario_source(data, args.revision)
    try:
        report = check_scenarios(source, settings, show_progress=False if args.json else None)
    except OSError as exc:
        if source.hub_repo is None:
            raise
        raise load_failure("DATA", data, exc) from None  # the Hub refused or could not serve a file
    if args.json:
        print(json.dumps(report))
    else:
        run = report["run"]
        print("\n".join(report_lines(report)))
        print(
            f"\nreport: {Path(args.output) / 'scenario_report.json'} ({run['checked']} checked now, "
            f"{run['reused']} reused from earlier runs, {run['seconds']}s)"
        )
    return 0
