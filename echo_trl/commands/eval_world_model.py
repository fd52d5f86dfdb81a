"""``echo-trl eval-world-model``: held-out env-token cross-entropy of a model on a trajectory dataset.

    echo-trl eval-world-model --model PATH_OR_HUB_ID --dataset DATASET [--split test] [--json]

Teacher-forced cross-entropy (nats per token, temperature 1) of the environment-output tokens
given everything before them: the ECHO paper's world-model metric. ``--json`` prints exactly one
JSON object on stdout: ``{"ce_env": ..., "tokens_env": ..., "by_scenario": {...}, ...}``.
"""

from __future__ import annotations

import json
import sys

from ..data.hub import locate
from ..tokens.size_limit import DEFAULT_MAX_RENDERED_CHARS, set_max_rendered_chars
from .cli import ArgumentParser, positive_int
from .loading import load_dataset_named, load_model, load_tokenizer


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="echo-trl eval-world-model",
        description="Held-out env-token cross-entropy (nats/token, teacher-forced, temperature 1) of a model on "
        "a trajectory dataset: how well it predicts what the environment answered.",
    )
    p.add_argument("--model", required=True, help="model directory or Hub id (a PEFT adapter directory works too)")
    p.add_argument(
        "--dataset",
        required=True,
        help="trajectory dataset: an `echo-trl build-dataset` directory or a Hub dataset id",
    )
    p.add_argument("--split", default="train", help="split to read (Hub datasets / DatasetDict directories)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: the model's)")
    p.add_argument(
        "--max_length", type=int, default=None, help="cut trajectories at a message end to at most this many tokens"
    )
    p.add_argument(
        "--max_completion_length",
        type=int,
        default=None,
        help="cut each completion at a message end to at most this many tokens (as training does)",
    )
    p.add_argument(
        "--max_rendered_chars",
        type=positive_int,
        default=DEFAULT_MAX_RENDERED_CHARS,
        metavar="N",
        help="refuse a trajectory whose conversation rendered by the chat template is longer than N characters "
        "(tokenizer memory grows with it; default %(default)s)",
    )
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N trajectories")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--trust_remote_code", action="store_true", help="allow the model's custom code to run")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else")
    return p


def parse_args(argv: list[str]):
    return build_parser().parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from ..train.world_eval import evaluate_world_model  # torch: after parsing, so --help answers at once

    for name, what in ((args.model, "model"), (args.dataset, "dataset"), (args.tokenizer, "tokenizer")):
        if name is not None:
            locate(name, what)  # every name checked before anything slow is loaded
    ds = load_dataset_named(args.dataset, split=args.split)
    if args.limit is not None:
        ds = ds.select(range(min(args.limit, len(ds))))
    model = load_model(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    tokenizer = load_tokenizer(args.tokenizer or args.model, trust_remote_code=args.trust_remote_code)
    set_max_rendered_chars(tokenizer, args.max_rendered_chars)
    result = evaluate_world_model(
        model, tokenizer, ds, max_length=args.max_length, max_completion_length=args.max_completion_length
    )
    result = {"model": args.model, "dataset": args.dataset, **result}
    if args.json:
        print(json.dumps(result))
        return 0
    ce = result["ce_env"]
    print(
        f"held-out env-token CE: {'n/a' if ce is None else f'{ce:.4f}'} nats/token over {result['tokens_env']} "
        f"env-output tokens, {result['trajectories']} trajectories"
    )
    for name, s in result["by_scenario"].items():
        v = "n/a" if s["ce_env"] is None else f"{s['ce_env']:.4f}"
        print(f"  {name or '(no scenario)':<40} {v:>8}  ({s['tokens_env']} tokens, {s['trajectories']} traj.)")
    if result["tokens_env"] == 0:
        print("no env-output tokens in this dataset", file=sys.stderr)
    return 0
