"""One command-line convention for every ``echo-trl`` command: TRL's ``TrlParser`` over dataclasses.

A command declares its flags as dataclass fields, as TRL's configs do (``metadata={"help": ...}``, a grouped
``Parameters:`` docstring, checks in ``__post_init__``), and its positional arguments, if it has any, with
``parser.add_argument`` (argparse's public API: HfArgumentParser hands them back in a namespace after the
dataclasses). :func:`command_parser` builds the parser and :func:`parse_command` parses, so that every command

- takes ``--config YAML`` (TRL's: each key is a flag's value; the command line wins), the file and its values
  checked first, so a bad one is one line (argparse converts a default only when it is a string: a YAML number,
  list or mapping would reach the dataclass as written, so :func:`check_config_values` checks its type);
- takes both spellings of a flag, ``--max_length`` and ``--max-length`` (HfArgumentParser registers both), and
  never an abbreviation (``allow_abbrev=False``: ``--max_len`` is refused, not read as ``--max_length``);
- answers a usage error in one line ending with the ``--help`` hint, exit 2: argparse's own (a bad choice, a
  missing required flag), an unknown flag, a YAML key no flag has, and a value refused by a dataclass's
  ``__post_init__`` (:class:`FlagValueError`, raised by the checks at the end of this module);
- takes a flag given once per value (``--scenario a --scenario b``) for a ``list`` field whose metadata names the
  :class:`Repeated` action, as argparse's ``append`` did (HfArgumentParser's ``nargs="+"`` would let a later
  ``--scenario`` replace the earlier ones);
- keeps a switch (a ``bool`` field) a switch in front of a positional argument: HfArgumentParser gives it an
  optional value (``--json false``), so argparse would read ``stats --json DATASET`` as ``--json=DATASET``;
  a bare switch followed by a word that is not a truth value is passed as ``--json=true``.

It sits below ``commands/`` and ``demo/`` because both use it (the demo's options are ``echo-trl train --demo``'s).
TRL's parser loads neither torch nor transformers; ``commands/cli.py`` never imports this module, so
``echo-trl --help`` does not load TRL at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trl import TrlParser

from .errors import EchoTrlError

#: What HfArgumentParser's ``string_to_bool`` reads as a switch's value (case-insensitive).
TRUTH_VALUES = frozenset({"yes", "no", "true", "false", "t", "f", "y", "n", "1", "0"})


class FlagValueError(ValueError):
    """A flag value a settings dataclass refuses in ``__post_init__``: a usage error at the command line."""


class CommandParser(TrlParser):
    """TRL's parser with echo-trl's usage errors: one line naming the problem and the ``--help`` that lists the
    flags, exit 2 (argparse's ``error`` is public API, meant to be overridden)."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the flags)\n")


class Repeated(argparse.Action):
    """``action=`` of a repeatable flag (``metadata={"action": Repeated}`` on a ``list[...]`` field): one value per
    flag, appended, as argparse's ``append``. HfArgumentParser passes a list field ``nargs="+"``; this action takes
    one value whatever ``nargs`` it is given, so ``--scenario a b`` stays refused as before. A list set by
    ``--config`` (the action's default) is replaced by the command line's values, not extended: the command line
    wins, as for every other flag."""

    def __init__(self, option_strings, dest, nargs=None, **kwargs):
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        earlier = [] if current is None or current is self.default else list(current)
        setattr(namespace, self.dest, [*earlier, values])


def command_parser(
    prog: str,
    dataclass_types: Sequence[type],
    *,
    usage: str | None = None,
    description: str | None = None,
    epilog: str | None = None,
) -> CommandParser:
    """The parser of ``prog`` (``"echo-trl stats"``): one flag per field of ``dataclass_types``; descriptions
    printed as written (they hold examples and tables)."""
    return CommandParser(
        list(dataclass_types),
        prog=prog,
        usage=usage,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )


def parse_command(parser: CommandParser, argv: Sequence[str]) -> tuple[Any, ...]:
    """The dataclasses of ``parser`` filled from ``argv`` (and ``--config``), then, when the command has positional
    arguments, the namespace holding them.

    Usage errors end the process (one line, exit 2); a bad ``--config`` file is an ``EchoTrlError``; any other
    ``ValueError`` of a dataclass (TRL's ``TrainingArguments`` checks) is left to the caller.
    """
    argv = list(argv)
    config = check_config_file(argv)
    if config is not None:
        check_config_values(config_path(argv), config, parser.dataclass_types)
    argv = bare_switches(argv, switch_flags(parser.dataclass_types))
    try:
        *parsed, from_config, unknown = parser.parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except FlagValueError as exc:
        parser.error(str(exc))
    if from_config:  # TRL turns each unused key into ["--key", "value"]
        keys = ", ".join(flag.removeprefix("--") for flag in from_config[::2])
        parser.error(f"--config {config_path(argv)}: no flag named {keys}")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return tuple(parsed)


def switch_flags(dataclass_types: Sequence[type]) -> frozenset[str]:
    """Both spellings of every flag HfArgumentParser makes a switch with an optional value (a ``bool`` field, or
    a ``bool | None`` one whose default is not ``None``)."""
    flags = set()
    for dtype in dataclass_types:
        hints = typing.get_type_hints(dtype)
        for f in dataclasses.fields(dtype):
            if f.init and (hints[f.name] is bool or (hints[f.name] == bool | None and f.default is not None)):
                flags.update({f"--{f.name}", f"--{f.name.replace('_', '-')}"})
    return frozenset(flags)


def bare_switches(argv: list[str], switches: frozenset[str]) -> list[str]:
    """``argv`` with each switch that is followed by a word other than a truth value written ``--switch=true``,
    so that the word stays a positional argument (or an unknown one) instead of a bad value of the switch."""
    out = list(argv)
    end = out.index("--") if "--" in out else len(out)
    for i in range(end - 1):
        following = out[i + 1]
        if out[i] in switches and not following.startswith("-") and following.lower() not in TRUTH_VALUES:
            out[i] += "=true"
    return out


# --- --config YAML ---------------------------------------------------------------------------------------------


def config_path(argv: list[str]) -> Path | None:
    """The file named by ``--config`` in ``argv``, if any."""
    if "--config" not in argv:
        return None
    i = argv.index("--config")
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        raise EchoTrlError("--config: expected a YAML file path after it")
    return Path(argv[i + 1])


def check_config_file(argv: list[str]) -> dict[str, Any] | None:
    """``--config PATH`` names a readable YAML mapping (TRL would raise a traceback); returns the mapping."""
    path = config_path(argv)
    if path is None:
        return None
    if not path.is_file():
        raise EchoTrlError(f"--config {path}: no such file")
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise EchoTrlError(f"--config {path}: not readable YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(config, dict):
        raise EchoTrlError(f"--config {path}: expected a mapping of flag names to values, got {type(config).__name__}")
    return config


#: What a YAML value of a field of each simple type may be (a string: argparse converts it as it would a flag).
_ACCEPTED: dict[type, tuple[type, ...]] = {bool: (bool, str), int: (int, str), float: (int, float, str), str: (str,)}
_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURALS = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}


def check_config_values(path: Path, config: dict[str, Any], dataclass_types) -> None:
    """Every value of ``config`` given to a field of ``dataclass_types`` has the field's type.

    Fields of the simple types (``bool``, ``int``, ``float``, ``str``, a ``list`` of one of them, each optionally
    ``| None``) are checked; others (TRL's unions, mappings) are left to their own checks.
    """
    for dtype in dataclass_types:
        hints = typing.get_type_hints(dtype)
        for f in dataclasses.fields(dtype):
            if f.init and f.name in config:
                problem = _type_problem(hints[f.name], config[f.name])
                if problem:
                    raise EchoTrlError(f"--config {path}: {f.name}: expected {problem}, got {config[f.name]!r}")


def _type_problem(hint: Any, value: Any) -> str | None:
    """What ``value`` should have been for a field typed ``hint`` (``None`` when it fits or the type is not simple)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1 or len(args) != 2:
            return None
        if value is None:
            return None
        hint, args = inner[0], typing.get_args(inner[0])
    if typing.get_origin(hint) is list and len(args) == 1 and args[0] in _ACCEPTED:
        # a string goes through argparse whole, as TRL reads one (``lora_target_modules: all-linear``)
        ok = isinstance(value, str) or (isinstance(value, list) and all(_fits(args[0], v) for v in value))
        return None if ok else f"a list of {_PLURALS[args[0]]}"
    if hint in _ACCEPTED and not _fits(hint, value):
        return _NAMES[hint]
    return None


def _fits(hint: type, value: Any) -> bool:
    return isinstance(value, _ACCEPTED[hint]) and not (hint is not bool and isinstance(value, bool))


# --- checks for __post_init__: the messages argparse's type functions gave ---------------------------------------


def chat_template_path_field() -> Any:
    """The ``--chat_template_path`` flag of the commands that tokenize, as TRL's ``SFTConfig`` takes it."""
    return dataclasses.field(
        default=None,
        metadata={
            "help": "render with this chat template instead of the tokenizer's (as TRL's SFTConfig takes it: a "
            ".jinja file, or a tokenizer directory / Hub id to take its template from)",
            "metavar": "PATH",
        },
    )


def positive_int(flag: str, value: Any) -> None:
    """A count: an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FlagValueError(f"argument --{flag}: expected a positive integer, got {str(value)!r}")


def positive_number(flag: str, value: Any) -> None:
    """A duration: a finite number > 0 (``nan``, ``inf``, ``0`` and ``-1`` are refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise FlagValueError(f"argument --{flag}: expected a finite number > 0, got {_shown(value)!r}")


def non_negative_number(flag: str, value: Any) -> None:
    """A wait or a floor that may be 0: a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise FlagValueError(f"argument --{flag}: expected a finite number >= 0, got {_shown(value)!r}")


def _shown(value: Any) -> str:
    """A refused number as the user most likely wrote it: ``-1``, not the ``-1.0`` argparse's ``float`` made of it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)
