"""``echo-trl build-dataset``: AWM episode files -> typed trajectory dataset on disk (and the Hub)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..command_line import CommandParser, FlagValueError, command_parser, parse_command, positive_int
from ..data.build import write_awm_dataset
from ..data.card import dataset_card, plural
from ..data.readers.episode_files import find_episode_files
from ..data.readers.formats import FORMATS, VERIFY_TURNS
from ..data.readers.prompt import DEFAULT_SYSTEM_PROMPT
from ..data.store import DATASET_MARKER, load_echo_dataset, push_dataset
from ..io.outputs import atomic_output_dir, check_output_dir

DESCRIPTION = """\
Read recorded AWM episodes (OpenEnv capture JSON, AWM session trajectory.json, JSONL of
either; files or directories, searched recursively in sorted order) or conversation logs with
a reward (OpenEnv `openenv collect` results.jsonl: roles from the message roles) and write the
ECHO trajectory dataset: `save_to_disk` files, a dataset card (README.md) and, with
--skip-invalid, skipped.jsonl listing every rejected record with its reason.

--format chat-template gives each scenario tool to the model's chat template; --format awm-agent
renders the official AWM agent's conversation (its system prompt, the list_tools / call_tool
meta-tools, the tool list as list_tools' reply, `Error: ` on failed calls, the final answer), the
format the Arctic-AWM models were trained on. By default each episode is built in the format it
was captured in (`echo-trl capture` records it), chat-template where it records none; an episode
that carries the sampler's log-probs is refused in any other format (they belong to the
conversation it was captured in).

Input that yields no valid episode is an error; so is a directory without episode files or one
that cannot be read (with --skip-invalid: reported like an invalid record). The output is
written beside --output and swapped in at the end: a killed build leaves the previous dataset
intact, and a second build into the same --output is refused while one runs. An existing
--output must be empty or a previous dataset."""

EPILOG = """\
examples:
  echo-trl build-dataset data/episodes --output outputs/awm_ds
  echo-trl build-dataset runs/*.jsonl --output ds --skip-invalid --push-to-hub me/awm-echo
  echo-trl build-dataset data/episodes --output outputs/awm_agent_ds --format awm-agent
  echo-trl build-dataset collect_out/results.jsonl --output ds   # openenv collect output

exit codes: 0 ok (also when --skip-invalid skipped records), 2 bad input (the message names
file:record: field) or an --output that cannot be written, 1 internal error."""


@dataclass
class BuildDatasetArguments:
    """Flags of ``echo-trl build-dataset`` (the episode files and directories are its positional arguments).

    Parameters:
        > Parameters that control where the dataset goes

        output (`str`):
            Directory to save the dataset in (``-o``); an existing one must be empty or a previous dataset.
        push_to_hub (`str` or `None`, *optional*):
            Also push the dataset and its card to this Hub repository.
        private (`bool`, *optional*, defaults to `False`):
            Create the Hub repository as private.

        > Parameters that control what each trajectory holds

        skip_invalid (`bool`, *optional*, defaults to `False`):
            Keep the valid episodes and report the invalid ones in ``skipped.jsonl`` (default: stop at the first).
        compact_tools (`bool`, *optional*, defaults to `False`):
            Drop the response documentation fastapi-mcp appends to each tool description (``chat-template`` only).
        system_prompt (`str`, *optional*, defaults to the chat-template prompt):
            System prompt of every trajectory (``{scenario}`` is filled in; ``""`` for none).
        format (`str` or `None`, *optional*):
            Conversation format: ``chat-template`` or ``awm-agent`` (the official AWM agent's); default: the one
            each episode was captured in (``chat-template`` where it records none).
        verify_turn (`str` or `None`, *optional*):
            The verifier step as an ``env_output`` message, or omitted (default: by format).

        > Parameters that control the build

        num_proc (`int` or `None`, *optional*):
            Processes converting the episode files (default: the cores available; one for small inputs).
    """

    output: str = field(metadata={"help": "where to save the dataset", "metavar": "DIR", "aliases": ["-o"]})
    skip_invalid: bool = field(
        default=False,
        metadata={"help": "keep valid episodes and report invalid ones (default: stop at the first invalid one)"},
    )
    push_to_hub: str | None = field(
        default=None, metadata={"help": "also push the dataset and its card to this Hub repo", "metavar": "REPO"}
    )
    private: bool = field(default=False, metadata={"help": "create the Hub repo as private"})
    compact_tools: bool = field(
        default=False,
        metadata={
            "help": "drop the response documentation fastapi-mcp appends to each tool description "
            "(AWM tool schemas shrink ~5x; the input schemas are kept)"
        },
    )
    system_prompt: str = field(
        default=DEFAULT_SYSTEM_PROMPT,
        metadata={
            "help": "system prompt of every trajectory ('{scenario}' is filled in; '' for none; "
            "with --format awm-agent the default is the official agent's prompt)"
        },
    )
    format: str | None = field(
        default=None,
        metadata={
            "help": "conversation format: chat-template, or awm-agent (the official AWM agent's); default: each "
            "episode's own, the one it was captured in (chat-template where it records none)",
            "choices": list(FORMATS),
        },
    )
    verify_turn: str | None = field(
        default=None,
        metadata={
            "help": "the verifier step as an env_output message, or omitted (default: env_output for "
            "chat-template, omit for awm-agent: the official agent never shows the verifier, and "
            "its raw_result can reveal the answer)",
            "choices": list(VERIFY_TURNS),
        },
    )

    num_proc: int | None = field(
        default=None,
        metadata={
            "help": "processes converting the episode files, each a contiguous run of them (default: the cores "
            "available; inputs under 32 MB are built in one)",
            "metavar": "N",
        },
    )

    def __post_init__(self):
        if self.num_proc is not None:
            positive_int("num_proc", self.num_proc)
        if self.compact_tools and self.format == "awm-agent":
            raise FlagValueError(
                "--compact-tools applies to --format chat-template (awm-agent lists the tools "
                "exactly as the official agent does)"
            )


def make_parser() -> CommandParser:
    parser = command_parser(
        "echo-trl build-dataset",
        [BuildDatasetArguments],
        usage="echo-trl build-dataset EPISODE_FILES_OR_DIRS... --output DIR [--config YAML] [FLAGS...]",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    parser.add_argument("inputs", nargs="+", metavar="EPISODE_FILES_OR_DIRS", help=".json/.jsonl files or directories")
    return parser


def parse_args(argv: list[str]) -> tuple[list[str], BuildDatasetArguments]:
    """The episode files / directories and the flags."""
    args, positional = parse_command(make_parser(), argv)
    return positional.inputs, args


def main(argv: list[str]) -> int:
    inputs, args = parse_args(argv)
    out = Path(args.output)
    check_output_dir(out, replace_if=DATASET_MARKER)  # before the build, not after it
    needs = sum(f.stat().st_size for f in find_episode_files(inputs, [])) or None  # about the Arrow size
    with atomic_output_dir(out, replace_if=DATASET_MARKER, needs=needs) as tmp:
        result = write_awm_dataset(  # streamed: memory flat in the number of episodes
            inputs,
            tmp,
            num_proc=args.num_proc,
            strict=not args.skip_invalid,
            system_prompt=args.system_prompt or None,
            skipped_file=tmp / "skipped.jsonl",
            compact_tools=args.compact_tools,
            format=args.format,
            verify_turn=args.verify_turn,
        )
        if not result.skipped:
            (tmp / "skipped.jsonl").unlink()
        card = dataset_card(result.counts, skipped=result.skipped)
        (tmp / "README.md").write_text(card, encoding="utf-8")
    counts = result.counts
    print(
        f"built {plural(counts.rows, 'episode')} from {plural(len(counts.scenarios), 'scenario')}, "
        f"format {', '.join(sorted(counts.formats)) or args.format} -> {out}"
    )
    if result.skipped:
        print(f"skipped {result.skipped} invalid record(s); reasons in {out / 'skipped.jsonl'}:", file=sys.stderr)
        for reason in result.reasons:
            print(f"  {reason}", file=sys.stderr)
        if result.skipped > len(result.reasons):
            print(f"  ... and {result.skipped - len(result.reasons)} more", file=sys.stderr)
    if args.push_to_hub:
        push_dataset(load_echo_dataset(out), card, args.push_to_hub, private=args.private or None, saved=out)
        print(f"pushed to https://huggingface.co/datasets/{args.push_to_hub}")
    return 0
