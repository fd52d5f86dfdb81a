"""``echo-trl capture``'s parser: the argparse convention every command used before :mod:`echo_trl.command_line`.

Kept for ``capture`` alone, and only until it moves to :mod:`echo_trl.command_line` (dataclasses parsed by TRL's
``TrlParser``, as every other sub-command is): issue 31 left ``capture`` on it while its collection library is
being restructured. It reaches into argparse's private option registry to show flags with underscores and accept
the hyphen spelling, which HfArgumentParser does with public API; nothing else may import this module.
"""

from __future__ import annotations

import argparse
import math
import sys


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` with echo-trl's flag conventions (the ones :mod:`echo_trl.command_line` keeps with TRL's parser).

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
