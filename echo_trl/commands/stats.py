"""``echo-trl stats``: exact token accounting per role for a trajectory dataset."""

from __future__ import annotations

import argparse
import json

from ..errors import EchoTrlError
from ..loading import load_tokenizer, load_trajectories
from ..stats import format_stats, token_stats
from ..tokenization import annotate_roles, tokenize_with_roles

DESCRIPTION = """\
Tokenize every trajectory exactly as the trainer does (the model's chat template, one
tokenization of the whole rendered conversation) and count tokens per role: context,
action (trained by GRPO), env_output (trained by ECHO's world-model loss) and warning.
DATASET is a `build-dataset` directory, a Hub dataset id, or episode files/directories."""

EPILOG = """\
examples:
  echo-trl stats outputs/awm_ds --tokenizer Qwen/Qwen3-0.6B
  echo-trl stats data/episodes --tokenizer ./my-model --json | jq .env_share_of_learnable
  echo-trl stats data/episodes --tokenizer ./my-model --show 0   # which tokens each loss sees"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="echo-trl stats", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", metavar="DATASET")
    p.add_argument("--tokenizer", required=True, metavar="MODEL_OR_PATH",
                   help="tokenizer (with its chat template) of the model you will train")
    p.add_argument("--split", default="train", help="dataset split (default: train)")
    p.add_argument("--max-length", type=int, default=None,
                   help="also report what truncation at this many tokens would cut")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")
    p.add_argument("--show", type=int, metavar="ROW", default=None,
                   help="print row ROW rendered with [role]...[/role] markers around each learnable span")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the tokenizer's custom code to run")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer, trust_remote_code=args.trust_remote_code)
    dataset = load_trajectories(args.dataset, split=args.split)
    if args.show is not None:
        if not 0 <= args.show < len(dataset):
            raise EchoTrlError(f"--show {args.show}: the dataset has rows 0..{len(dataset) - 1}")
        tokens = tokenize_with_roles(tokenizer, dataset[args.show])
        print(annotate_roles(tokenizer, tokens))
        return 0
    stats = token_stats(tokenizer, dataset, max_length=args.max_length, show_progress=False if args.json else None)
    print(json.dumps(stats) if args.json else format_stats(stats))
    return 0
