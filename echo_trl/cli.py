"""``echo-trl``: one console script, one sub-command per job.

Each sub-command lives in ``echo_trl/commands/<name>.py`` with ``main(argv) -> int``; this
module only dispatches, so ``echo-trl --help`` answers without importing torch or TRL.

Exit codes: 0 success; 1 unexpected internal error (a bug: please report it with the
traceback); 2 bad input or usage (the message says which file/record/field); 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import sys

from .errors import EchoTrlError

#: sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build-dataset": ("echo_trl.commands.build_dataset",
                      "AWM episode files/dirs -> typed trajectory dataset (save_to_disk, optional Hub push)"),
    "stats": ("echo_trl.commands.stats", "exact token accounting per role (context/action/env_output/warning)"),
    "train": ("echo_trl.commands.train", "train with ECHO (GRPO + lambda * env-token CE); no args = CPU demo"),
    "eval-world-model": ("echo_trl.commands.eval_world_model",
                         "held-out env-token cross-entropy (the paper's world-model metric)"),
    "capture": ("echo_trl.commands.capture", "run AWM scenarios locally and record episodes"),
}

USAGE = "usage: echo-trl COMMAND [--help] [ARGS...]"


def _help() -> str:
    width = max(map(len, COMMANDS))
    lines = [USAGE, "", "ECHO for Hugging Face TRL.", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `echo-trl COMMAND --help` for a command's options.",
              "Exit codes: 0 ok, 1 internal error, 2 bad input or usage, 130 interrupted."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_help())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"echo-trl: unknown command {name!r}\n\n{_help()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except EchoTrlError as exc:
        print(f"echo-trl {name}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `echo-trl stats ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"echo-trl {name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
