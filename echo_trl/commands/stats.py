"""``echo-trl stats``: exact token accounting per role for a trajectory dataset."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..command_line import (
    CommandParser,
    FlagValueError,
    chat_template_path_field,
    command_parser,
    parse_command,
    positive_int,
)
from ..data.card import plural
from ..errors import EchoTrlError
from ..tokens.cache import row_tokens, tokenize_dataset
from ..tokens.size_limit import DEFAULT_MAX_RENDERED_CHARS, set_max_rendered_chars
from ..tokens.stats import format_stats, token_stats, truncated
from ..tokens.tokenization import annotate_roles, tokenize_with_roles
from .support.loading import load_tokenizer, load_trajectories

DESCRIPTION = """\
Tokenize every trajectory exactly as the trainer does (the model's chat template, one
tokenization of the whole rendered conversation) and count tokens per role: context,
action (trained by GRPO), env_output (trained by ECHO's world-model loss) and warning.
DATASET is a `build-dataset` directory, a Hub dataset id, or episode files/directories."""

EPILOG = """\
examples:
  echo-trl stats outputs/awm_ds --tokenizer outputs/tiny-qwen3
  echo-trl stats data/episodes --tokenizer outputs/tiny-qwen3 --json
  echo-trl stats data/episodes --tokenizer outputs/tiny-qwen3 --show 0   # which tokens each loss sees
  echo-trl stats outputs/awm_ds --tokenizer Qwen/Qwen3-0.6B --max_length 8192   # what a cut would remove
  echo-trl stats outputs/awm_ds --tokenizer MODEL_DIR --chat_template_path qwen2_5.jinja   # another template"""

#: rows listed one by one in the text report of ``--max_length`` (``--json`` lists all)
LISTED_ROWS = 20


@dataclass
class StatsArguments:
    """Flags of ``echo-trl stats`` (the dataset is its positional argument).

    Parameters:
        > Parameters that control what is counted

        tokenizer (`str`):
            Tokenizer (with its chat template) of the model you will train: a directory or a Hub id.
        chat_template_path (`str` or `None`, *optional*):
            Render with this chat template instead of the tokenizer's (TRL's ``chat_template_path``: a ``.jinja``
            file or a tokenizer directory / Hub id to take it from).
        split (`str`, *optional*, defaults to `"train"`):
            Dataset split to count.
        max_length (`int` or `None`, *optional*):
            Also report, per row, what a cut at this many tokens (at a message end) would remove.
        max_rendered_chars (`int`, *optional*, defaults to the library's limit):
            Refuse a row whose conversation rendered by the chat template is longer than this many characters.
        trust_remote_code (`bool`, *optional*, defaults to `False`):
            Allow the tokenizer's custom code to run.
        num_proc (`int` or `None`, *optional*):
            Processes building the token cache when it is missing (default: the cores available).

        > Parameters that control what is printed

        json (`bool`, *optional*, defaults to `False`):
            Print one JSON object on stdout and nothing else.
        show (`int` or `None`, *optional*):
            Print this row rendered with ``[role]...[/role]`` markers around each learnable span instead.
    """

    tokenizer: str = field(
        metadata={"help": "tokenizer (with its chat template) of the model you will train", "metavar": "MODEL_OR_PATH"}
    )
    chat_template_path: str | None = chat_template_path_field()
    split: str = field(default="train", metadata={"help": "dataset split (default: train)"})
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "also report, per row, what a cut at N tokens (at a message end) would remove; the counts "
            "above stay those of the whole trajectories",
            "metavar": "N",
        },
    )
    max_rendered_chars: int = field(
        default=DEFAULT_MAX_RENDERED_CHARS,
        metadata={
            "help": "refuse a row whose conversation rendered by the chat template is longer than N characters "
            f"(tokenizer memory grows with it; default {DEFAULT_MAX_RENDERED_CHARS}, far beyond any context window)",
            "metavar": "N",
        },
    )
    json: bool = field(default=False, metadata={"help": "print one JSON object on stdout and nothing else"})
    show: int | None = field(
        default=None,
        metadata={
            "help": "print row ROW rendered with [role]...[/role] markers around each learnable span",
            "metavar": "ROW",
        },
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "allow the tokenizer's custom code to run"})
    num_proc: int | None = field(
        default=None,
        metadata={
            "help": "processes building the token cache (shared with train / sft / eval-world-model) when it is "
            "missing (default: the cores available)",
            "metavar": "N",
        },
    )

    def __post_init__(self):
        positive_int("max_rendered_chars", self.max_rendered_chars)
        if self.num_proc is not None:
            positive_int("num_proc", self.num_proc)
        if self.max_length is not None and self.max_length < 1:
            raise FlagValueError(f"--max_length {self.max_length}: expected a positive number of tokens")


def make_parser() -> CommandParser:
    parser = command_parser(
        "echo-trl stats",
        [StatsArguments],
        usage="echo-trl stats DATASET --tokenizer MODEL_OR_PATH [--config YAML] [--json] [FLAGS...]",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    parser.add_argument("dataset", metavar="DATASET", help="a `build-dataset` directory, a Hub id, or episode files")
    return parser


def parse_args(argv: list[str]) -> tuple[str, StatsArguments]:
    """The dataset and the flags."""
    args, positional = parse_command(make_parser(), argv)
    return positional.dataset, args


def truncation_report(
    tokenizer, dataset, max_length: int, *, show_progress: bool | None = None, num_proc: int | None = None
) -> dict[str, Any]:
    """What cutting each trajectory at ``max_length`` tokens (at a completion message end) would remove, from the
    token cache (the rows longer than the cut are the only ones read).

    A row whose prompt alone is longer is reported as such (nothing of it would be left to train on)
    instead of failing the whole report: finding those rows is what the report is for.
    """
    tokens = tokenize_dataset(dataset, tokenizer, show_progress=show_progress, num_proc=num_proc)
    rows: list[dict[str, Any]] = []
    cut_by_role: dict[str, int] = {}
    for i, length, kept in truncated(tokens, max_length):
        full = row_tokens(tokens[i])
        entry: dict[str, Any] = {"row": i, "group_id": tokens[i]["group_id"], "tokens": length}
        if kept is None:
            entry.update(prompt_tokens=full.prompt_length, prompt_exceeds=True)
        else:
            whole, left = full.counts(), kept.counts()
            entry.update(
                cut_tokens=length - len(kept),
                cut_messages=kept.truncated_messages,
                cut_by_role={r: whole[r] - left[r] for r in whole if whole[r] != left[r]},
            )
            for r, v in entry["cut_by_role"].items():
                cut_by_role[r] = cut_by_role.get(r, 0) + v
        rows.append(entry)
    cut = [r for r in rows if not r.get("prompt_exceeds")]
    return {
        "max_length": max_length,
        "truncated_episodes": len(cut),
        "truncated_tokens": sum(r["cut_tokens"] for r in cut),
        "truncated_by_role": cut_by_role,
        "prompt_exceeds_episodes": len(rows) - len(cut),
        "rows": rows,
    }


def format_truncation(report: dict[str, Any], episodes: int) -> str:
    """The text form of :func:`truncation_report`."""
    roles = ", ".join(f"{r} {v}" for r, v in report["truncated_by_role"].items())
    lines = [
        f"cut at max_length={report['max_length']}: {report['truncated_episodes']} of "
        f"{plural(episodes, 'episode')} would lose {plural(report['truncated_tokens'], 'token')}"
        + (f" ({roles})" if roles else "")
    ]
    if report["prompt_exceeds_episodes"]:
        n = report["prompt_exceeds_episodes"]
        lines.append(
            f"  {plural(n, 'episode')} {'has' if n == 1 else 'have'} a prompt longer than "
            f"{report['max_length']} tokens: nothing of {'it' if n == 1 else 'them'} would be left to train on"
        )
    for r in report["rows"][:LISTED_ROWS]:
        if r.get("prompt_exceeds"):
            lines.append(
                f"  row {r['row']} ({r['group_id']}): {r['tokens']} tokens; the prompt alone has {r['prompt_tokens']}"
            )
        else:
            roles = ", ".join(f"{k} {v}" for k, v in r["cut_by_role"].items())
            lines.append(
                f"  row {r['row']} ({r['group_id']}): {r['tokens']} tokens, cut {r['cut_tokens']} "
                f"in the last {plural(r['cut_messages'], 'message')} ({roles})"
            )
    if len(report["rows"]) > LISTED_ROWS:
        lines.append(f"  ... and {len(report['rows']) - LISTED_ROWS} more rows (--json lists all)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    dataset_name, args = parse_args(argv)
    tokenizer = load_tokenizer(
        args.tokenizer, trust_remote_code=args.trust_remote_code, chat_template_path=args.chat_template_path
    )
    set_max_rendered_chars(tokenizer, args.max_rendered_chars)
    dataset = load_trajectories(dataset_name, split=args.split)
    if args.show is not None:
        if not 0 <= args.show < len(dataset):
            raise EchoTrlError(f"--show {args.show}: the dataset has rows 0..{len(dataset) - 1}")
        try:
            tokens = tokenize_with_roles(tokenizer, dataset[args.show])
        except EchoTrlError as exc:
            raise type(exc)(f"row {args.show}: {exc}") from None
        print(annotate_roles(tokenizer, tokens))
        return 0
    show_progress = False if args.json else None
    stats = token_stats(tokenizer, dataset, show_progress=show_progress, num_proc=args.num_proc)
    report = None
    if args.max_length is not None:
        report = truncation_report(
            tokenizer, dataset, args.max_length, show_progress=show_progress, num_proc=args.num_proc
        )
        stats.update(
            {k: report[k] for k in ("max_length", "truncated_episodes", "truncated_tokens")}, truncation=report
        )
    if args.json:
        print(json.dumps(stats))
    else:
        print(format_stats({k: v for k, v in stats.items() if k != "max_length"}))
        if report is not None:
            print("\n" + format_truncation(report, stats["episodes"]))
    return 0
