"""``echo-trl build-dataset``: AWM episode files -> typed trajectory dataset on disk (and the Hub)."""

from __future__ import annotations

import argparse
import sys

from ..data.build import build_awm_dataset
from ..data.card import plural
from ..data.formats import FORMATS, VERIFY_TURNS
from ..data.prompt import DEFAULT_SYSTEM_PROMPT
from ..data.records import SkippedRecord
from ..data.store import DATASET_MARKER, save_dataset
from ..io.outputs import check_output_dir
from .cli import ArgumentParser  # underscores, hyphen aliases, no abbreviations

DESCRIPTION = """\
Read recorded AWM episodes (OpenEnv capture JSON, AWM session trajectory.json, JSONL of
either; files or directories, searched recursively in sorted order) or conversation logs with
a reward (OpenEnv `openenv collect` results.jsonl: roles from the message roles) and write the
ECHO trajectory dataset: `save_to_disk` files, a dataset card (README.md) and, with
--skip-invalid, skipped.jsonl listing every rejected record with its reason.

--format chat-template (default) gives each scenario tool to the model's chat template;
--format awm-agent renders the official AWM agent's conversation (its system prompt, the
list_tools / call_tool meta-tools, the tool list as list_tools' reply, `Error: ` on failed
calls, the final answer), the format the Arctic-AWM models were trained on.

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


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="echo-trl build-dataset",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", metavar="EPISODE_FILES_OR_DIRS", help=".json/.jsonl files or directories")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="where to save the dataset")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="keep valid episodes and report invalid ones (default: stop at the first invalid one)",
    )
    p.add_argument("--push-to-hub", metavar="REPO", help="also push the dataset and its card to this Hub repo")
    p.add_argument("--private", action="store_true", help="create the Hub repo as private")
    p.add_argument(
        "--compact-tools",
        action="store_true",
        help="drop the response documentation fastapi-mcp appends to each tool description "
        "(AWM tool schemas shrink ~5x; the input schemas are kept)",
    )
    p.add_argument(
        "--system-prompt",
        default=DEFAULT_SYSTEM_PROMPT,
        help="system prompt of every trajectory ('{scenario}' is filled in; '' for none; "
        "with --format awm-agent the default is the official agent's prompt)",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="chat-template",
        help="conversation format (default chat-template; awm-agent: the official AWM agent's)",
    )
    p.add_argument(
        "--verify-turn",
        choices=VERIFY_TURNS,
        default=None,
        help="the verifier step as an env_output message, or omitted (default: env_output for "
        "chat-template, omit for awm-agent: the official agent never shows the verifier, and "
        "its raw_result can reveal the answer)",
    )
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.compact_tools and args.format == "awm-agent":
        parser.error(
            "--compact-tools applies to --format chat-template (awm-agent lists the tools "
            "exactly as the official agent does)"
        )
    check_output_dir(args.output, replace_if=DATASET_MARKER)  # before the build, not after it
    skipped: list[SkippedRecord] = []
    ds = build_awm_dataset(
        args.inputs,
        strict=not args.skip_invalid,
        system_prompt=args.system_prompt or None,
        skipped=skipped,
        compact_tools=args.compact_tools,
        format=args.format,
        verify_turn=args.verify_turn,
    )
    out = save_dataset(ds, args.output, skipped=skipped, push_to_hub=args.push_to_hub, private=args.private or None)
    scenarios = len(set(ds["scenario"]))
    print(f"built {plural(len(ds), 'episode')} from {plural(scenarios, 'scenario')}, format {args.format} -> {out}")
    if skipped:
        print(f"skipped {len(skipped)} invalid record(s); reasons in {out / 'skipped.jsonl'}:", file=sys.stderr)
        for s in skipped[:10]:
            print(f"  {s.reason}", file=sys.stderr)
        if len(skipped) > 10:
            print(f"  ... and {len(skipped) - 10} more", file=sys.stderr)
    if args.push_to_hub:
        print(f"pushed to https://huggingface.co/datasets/{args.push_to_hub}")
    return 0
