"""``echo-trl build-dataset``: AWM episode files -> typed trajectory dataset on disk (and the Hub)."""

from __future__ import annotations

import argparse
import sys

from ..awm import DEFAULT_SYSTEM_PROMPT, SkippedRecord
from ..dataset import build_awm_dataset, save_dataset

DESCRIPTION = """\
Read recorded AWM episodes (OpenEnv capture JSON, AWM session trajectory.json, JSONL of
either; files or directories, searched recursively in sorted order) and write the ECHO
trajectory dataset: `save_to_disk` files, a dataset card (README.md) and, with
--skip-invalid, skipped.jsonl listing every rejected record with its reason."""

EPILOG = """\
examples:
  echo-trl build-dataset data/episodes --output outputs/awm_ds
  echo-trl build-dataset runs/*.jsonl --output ds --skip-invalid --push-to-hub me/awm-echo

exit codes: 0 ok (also when --skip-invalid skipped records), 2 bad input (the message names
file:record: field), 1 internal error."""


def build_parser() -> argparse.ArgumentParser:
    from ..cli import ArgumentParser  # underscores, hyphen aliases, no abbreviations

    p = ArgumentParser(prog="echo-trl build-dataset", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="EPISODE_FILES_OR_DIRS", help=".json/.jsonl files or directories")
    p.add_argument("--output", "-o", required=True, metavar="DIR", help="where to save the dataset")
    p.add_argument("--skip-invalid", action="store_true",
                   help="keep valid episodes and report invalid ones (default: stop at the first invalid one)")
    p.add_argument("--push-to-hub", metavar="REPO", help="also push the dataset and its card to this Hub repo")
    p.add_argument("--private", action="store_true", help="create the Hub repo as private")
    p.add_argument("--compact-tools", action="store_true",
                   help="drop the response documentation fastapi-mcp appends to each tool description "
                        "(AWM tool schemas shrink ~5x; the input schemas are kept)")
    p.add_argument("--system-prompt", default=DEFAULT_SYSTEM_PROMPT,
                   help="system prompt of every trajectory ('{scenario}' is filled in; '' for none)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    skipped: list[SkippedRecord] = []
    ds = build_awm_dataset(args.inputs, strict=not args.skip_invalid, system_prompt=args.system_prompt or None,
                           skipped=skipped, compact_tools=args.compact_tools)
    out = save_dataset(ds, args.output, skipped=skipped, push_to_hub=args.push_to_hub,
                       private=args.private or None)
    scenarios = len(set(ds["scenario"]))
    print(f"built {len(ds)} episodes from {scenarios} scenario(s) -> {out}")
    if skipped:
        print(f"skipped {len(skipped)} invalid record(s); reasons in {out / 'skipped.jsonl'}:", file=sys.stderr)
        for s in skipped[:10]:
            print(f"  {s.reason}", file=sys.stderr)
        if len(skipped) > 10:
            print(f"  ... and {len(skipped) - 10} more", file=sys.stderr)
    if args.push_to_hub:
        print(f"pushed to https://huggingface.co/datasets/{args.push_to_hub}")
    return 0
