"""``echo-trl``: one console script, one sub-command per job.

Each sub-command lives in ``echo_trl/commands/<name>.py`` with ``main(argv) -> int``; this
module dispatches (``echo-trl --help`` answers without importing torch or TRL) and holds the quiet defaults
every command shares. Each command parses its own flags with :mod:`echo_trl.command_line` (TRL's ``TrlParser``
over dataclasses), imported by the command module, never here.

Exit codes: 0 success; 1 unexpected internal error (a bug: please report it with the
traceback); 2 bad input or usage (the message says which file/record/field); 130 interrupted.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings

from ..errors import EchoTrlError
from ..help_pages import wants_help

#: sub-command -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build-dataset": (
        "echo_trl.commands.build_dataset",
        "AWM episode files/dirs -> typed trajectory dataset (save_to_disk, optional Hub push)",
    ),
    "stats": ("echo_trl.commands.stats", "exact token accounting per role (context/action/env_output/warning)"),
    "train": ("echo_trl.commands.train", "train with ECHO (GRPO + lambda * env-token CE); no args = CPU demo"),
    "sft": ("echo_trl.commands.sft", "SFT before ECHO: CE on action tokens + world_model_coeff * CE on env tokens"),
    "eval-world-model": (
        "echo_trl.commands.eval_world_model",
        "held-out env-token cross-entropy (the paper's world-model metric)",
    ),
    "capture": ("echo_trl.commands.capture.command", "run AWM scenarios locally and record episodes"),
    "materialize-model": (
        "echo_trl.commands.materialize_model",
        "a real pretrained model from an installed package as a local model directory (offline)",
    ),
    "check-scenarios": (
        "echo_trl.commands.check_scenarios",
        "AWM scenario and task health: databases, servers, verifiers, tasks that pass untouched",
    ),
}

USAGE = "usage: echo-trl COMMAND [--help] [ARGS...]"


def _help() -> str:
    width = max(map(len, COMMANDS))
    lines = [USAGE, "", "ECHO for Hugging Face TRL.", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += [
        "",
        "Run `echo-trl COMMAND --help` for a command's options.",
        "Exit codes: 0 ok, 1 internal error, 2 bad input or usage, 130 interrupted.",
    ]
    return "\n".join(lines)


def _not_the_cpu_accelerator_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Setting accelerator to CPU.")


def quiet_defaults() -> None:
    """What every sub-command shares: warnings that do not concern the user, and progress bars for short work, off.

    Kept: echo_trl's own bars for long work (``progress.py``), training progress, Hub download bars and
    every warning about the user's data or settings.
    """
    # TRL's config defaults gradient_checkpointing=True, which transformers 5 renamed: a FutureWarning on every
    # run that the user cannot act on (the flag still works)
    warnings.filterwarnings("ignore", message=r"`gradient_checkpointing.*` is deprecated", category=FutureWarning)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # DeepSpeed (imported by TRL / accelerate) prints "Setting accelerator to CPU ..." on stdout on every CPU run,
    # into `--json` output too; its logger is the same object before and after DeepSpeed configures it, so a
    # filter set now drops that one line and keeps every other DeepSpeed warning
    logging.getLogger("DeepSpeed").addFilter(_not_the_cpu_accelerator_notice)
    from ..progress import quiet_short_work  # tqdm: only once a command runs, not for --help

    quiet_short_work()


def _run(name: str, rest: list[str]) -> int:
    try:
        if not wants_help(rest):  # a --help page loads nothing it does not print (echo_trl.help_pages)
            quiet_defaults()
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except EchoTrlError as exc:
        from ..redact import redact  # the one redaction every error line passes through (API keys, Authorization)

        print(f"echo-trl {name}: error: {redact(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"echo-trl {name}: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(_help(), flush=True)
            return 0
        name, rest = argv[0], argv[1:]
        if name not in COMMANDS:
            print(f"echo-trl: unknown command {name!r}\n\n{_help()}", file=sys.stderr)
            return 2
        return _run(name, rest)
    except BrokenPipeError:  # e.g. `echo-trl --help | head -3`: the reader left, not an error
        # stdout is gone: point it at /dev/null so the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
