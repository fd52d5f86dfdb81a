"""``echo-trl``: one console script, one sub-command per job.

Each sub-command lives in ``echo_trl/commands/<name>.py`` with ``main(argv) -> int``; this
module dispatches (``echo-trl --help`` answers without importing torch or TRL) and holds what
every command shares: the :class:`ArgumentParser` conventions and the quiet defaults.

Exit codes: 0 success; 1 unexpected internal error (a bug: please report it with the
traceback); 2 bad input or usage (the message says which file/record/field); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import warnings

from ..errors import EchoTrlError

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
    "capture": ("echo_trl.commands.capture", "run AWM scenarios locally and record episodes"),
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


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` with echo-trl's flag conventions, shared by every sub-command.

    No abbreviations (``--max_step`` is not silently ``--max_steps``). One spelling per flag in
    ``--help``, with underscores as TRL writes them (whichever way a command defined it); the hyphen
    spelling (``--max-length`` for ``--max_length``) is accepted as an alias without cluttering ``--help``.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """A usage error is one line (the usage synopsis is one ``--help`` away), exit 2."""
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")

    def _underscored(self) -> None:
        """Show and register every long flag with underscores (``--skip-invalid`` becomes ``--skip_invalid``);
        the hyphen spelling stays accepted through :meth:`_respelled`. Idempotent; groups share the registry."""
        for action in self._actions:
            names = ["--" + o[2:].replace("-", "_") if o.startswith("--") else o for o in action.option_strings]
            if names != action.option_strings:
                action.option_strings = list(dict.fromkeys(names))
                for name in action.option_strings:
                    self._option_string_actions.setdefault(name, action)

    def format_usage(self) -> str:
        self._underscored()
        return super().format_usage()

    def format_help(self) -> str:
        self._underscored()
        return super().format_help()

    def _respelled(self, token: str) -> str:
        flag, eq, value = token.partition("=")
        if not flag.startswith("--") or flag in self._option_string_actions:
            return token
        for other in ("--" + flag[2:].replace("-", "_"), "--" + flag[2:].replace("_", "-")):
            if other in self._option_string_actions:
                return other + eq + value
        return token

    def parse_known_args(self, args=None, namespace=None):
        self._underscored()
        args = list(sys.argv[1:] if args is None else args)
        end = args.index("--") if "--" in args else len(args)
        return super().parse_known_args([*map(self._respelled, args[:end]), *args[end:]], namespace)


def positive_int(text: str) -> int:
    """``type=`` of a count flag: an integer >= 1 (argparse turns the error into a usage line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """``type=`` of a duration flag: a finite number > 0 (``nan``, ``inf``, ``0`` and ``-1`` are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """``type=`` of a flag that may be 0 (a wait, a probability floor): a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def quiet_defaults() -> None:
    """What every sub-command shares: warnings that do not concern the user, and progress bars for short work, off.

    Kept: echo_trl's own bars for long work (``progress.py``), training progress, Hub download bars and
    every warning about the user's data or settings.
    """
    # TRL's config defaults gradient_checkpointing=True, which transformers 5 renamed: a FutureWarning on every
    # run that the user cannot act on (the flag still works)
    warnings.filterwarnings("ignore", message=r"`gradient_checkpointing.*` is deprecated", category=FutureWarning)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from ..progress import quiet_short_work  # tqdm: only once a command runs, not for --help

    quiet_short_work()


def _run(name: str, rest: list[str]) -> int:
    try:
        quiet_defaults()
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except EchoTrlError as exc:
        print(f"echo-trl {name}: error: {exc}", file=sys.stderr)
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
