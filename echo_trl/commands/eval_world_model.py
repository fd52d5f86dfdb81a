"""``echo-trl eval-world-model``: held-out env-token cross-entropy of a model on a trajectory dataset.

    echo-trl eval-world-model --model PATH_OR_HUB_ID --dataset DATASET [--split test] [--json]

Teacher-forced cross-entropy (nats per token, temperature 1) of the environment-output tokens
given everything before them: the ECHO paper's world-model metric. ``--json`` prints exactly one
JSON object on stdout: ``{"ce_env": ..., "tokens_env": ..., "by_scenario": {...}, ...}``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from ..command_line import CommandParser, chat_template_path_field, command_parser, parse_command, positive_int
from ..data.hub import locate
from ..tokens.size_limit import DEFAULT_MAX_RENDERED_CHARS, set_max_rendered_chars
from .support.loading import load_dataset_named, load_model, load_tokenizer

DESCRIPTION = """\
Held-out env-token cross-entropy (nats/token, teacher-forced, temperature 1) of a model on a
trajectory dataset: how well it predicts what the environment answered."""


@dataclass
class EvalWorldModelArguments:
    """Flags of ``echo-trl eval-world-model``.

    Parameters:
        > Parameters that control what is evaluated

        model (`str`):
            Model directory or Hub id (a PEFT adapter directory works too).
        dataset (`str`):
            Trajectory dataset: an ``echo-trl build-dataset`` directory or a Hub dataset id.
        split (`str`, *optional*, defaults to `"train"`):
            Split to read (Hub datasets / DatasetDict directories).
        tokenizer (`str` or `None`, *optional*):
            Tokenizer (default: the model's).
        chat_template_path (`str` or `None`, *optional*):
            Render with this chat template instead of the tokenizer's (TRL's ``chat_template_path``: a ``.jinja``
            file or a tokenizer directory / Hub id to take it from).
        limit (`int` or `None`, *optional*):
            Evaluate only the first this many trajectories.

        > Parameters that control how trajectories are cut (as training does)

        max_length (`int` or `None`, *optional*):
            Cut trajectories at a message end to at most this many tokens.
        max_completion_length (`int` or `None`, *optional*):
            Cut each completion at a message end to at most this many tokens.
        max_rendered_chars (`int`, *optional*, defaults to the library's limit):
            Refuse a trajectory whose conversation rendered by the chat template is longer than this many characters.

        > Parameters that control the model and the output

        device (`str` or `None`, *optional*):
            Torch device (default: cuda if available, else cpu).
        dtype (`str`, *optional*, defaults to `"auto"`):
            ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        trust_remote_code (`bool`, *optional*, defaults to `False`):
            Allow the model's custom code to run.
        num_proc (`int` or `None`, *optional*):
            Processes building the token cache when it is missing (default: the cores available).
        json (`bool`, *optional*, defaults to `False`):
            Print one JSON object on stdout and nothing else.
    """

    model: str = field(metadata={"help": "model directory or Hub id (a PEFT adapter directory works too)"})
    dataset: str = field(
        metadata={"help": "trajectory dataset: an `echo-trl build-dataset` directory or a Hub dataset id"}
    )
    split: str = field(default="train", metadata={"help": "split to read (Hub datasets / DatasetDict directories)"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer (default: the model's)"})
    chat_template_path: str | None = chat_template_path_field()
    max_length: int | None = field(
        default=None, metadata={"help": "cut trajectories at a message end to at most this many tokens"}
    )
    max_completion_length: int | None = field(
        default=None,
        metadata={"help": "cut each completion at a message end to at most this many tokens (as training does)"},
    )
    max_rendered_chars: int = field(
        default=DEFAULT_MAX_RENDERED_CHARS,
        metadata={
            "help": "refuse a trajectory whose conversation rendered by the chat template is longer than N "
            f"characters (tokenizer memory grows with it; default {DEFAULT_MAX_RENDERED_CHARS})",
            "metavar": "N",
        },
    )
    limit: int | None = field(default=None, metadata={"help": "evaluate only the first N trajectories"})
    device: str | None = field(default=None, metadata={"help": "torch device (default: cuda if available, else cpu)"})
    dtype: str = field(
        default="auto",
        metadata={
            "help": "weights dtype (auto: the checkpoint's)",
            "choices": ["auto", "float32", "bfloat16", "float16"],
        },
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "allow the model's custom code to run"})
    json: bool = field(default=False, metadata={"help": "print one JSON object on stdout and nothing else"})
    num_proc: int | None = field(
        default=None,
        metadata={
            "help": "processes building the token cache (shared with train / sft / stats) when it is missing "
            "(default: the cores available)",
            "metavar": "N",
        },
    )

    def __post_init__(self):
        positive_int("max_rendered_chars", self.max_rendered_chars)
        if self.num_proc is not None:
            positive_int("num_proc", self.num_proc)


def make_parser() -> CommandParser:
    return command_parser(
        "echo-trl eval-world-model",
        [EvalWorldModelArguments],
        usage="echo-trl eval-world-model --model PATH --dataset DATASET [--config YAML] [--json] [FLAGS...]",
        description=DESCRIPTION,
    )


def parse_args(argv: list[str]) -> EvalWorldModelArguments:
    (args,) = parse_command(make_parser(), argv)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from ..tokens.cache import tokenize_dataset
    from ..train.world_eval import evaluate_world_model  # torch: after parsing, so --help answers at once

    names = ((args.model, "model"), (args.dataset, "dataset"), (args.tokenizer, "tokenizer"))
    for name, what in (*names, (args.chat_template_path, "--chat_template_path")):
        if name is not None:
            locate(name, what)  # every name checked before anything slow is loaded
    ds = load_dataset_named(args.dataset, split=args.split)
    if args.limit is not None:
        ds = ds.select(range(min(args.limit, len(ds))))
    model = load_model(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    tokenizer = load_tokenizer(
        args.tokenizer or args.model,
        trust_remote_code=args.trust_remote_code,
        chat_template_path=args.chat_template_path,
    )
    set_max_rendered_chars(tokenizer, args.max_rendered_chars)
    # the token cache train / sft / stats share (built when missing; with --limit only read if it exists)
    show_progress = False if args.json else None  # bars on a terminal (echo_trl.progress), as stats shows them
    built = tokenize_dataset(
        ds, tokenizer, build=args.limit is None, num_proc=args.num_proc, show_progress=show_progress
    )
    result = evaluate_world_model(
        model,
        tokenizer,
        built or ds,
        max_length=args.max_length,
        max_completion_length=args.max_completion_length,
        show_progress=show_progress,
    )
    result = {"model": args.model, "dataset": args.dataset, "chat_template_path": args.chat_template_path, **result}
    if args.json:
        print(json.dumps(result))
        return 0
    ce = result["ce_env"]
    print(
        f"env-token CE on {args.dataset}{'' if args.split == 'train' else f' (split {args.split})'}: "
        f"{'n/a' if ce is None else f'{ce:.4f}'} nats/token "
        f"over {result['tokens_env']} "
        f"env-output tokens, {result['trajectories']} trajectories"
    )
    for name, s in result["by_scenario"].items():
        v = "n/a" if s["ce_env"] is None else f"{s['ce_env']:.4f}"
        print(f"  {name or '(no scenario)':<40} {v:>8}  ({s['tokens_env']} tokens, {s['trajectories']} traj.)")
    if result["tokens_env"] == 0:
        print("no env-output tokens in this dataset", file=sys.stderr)
    return 0
