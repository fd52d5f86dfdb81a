"""``--help`` pages that answer at once: rendered from the real parsers ahead of time, printed from a file.

``echo-trl train`` and ``echo-trl sft`` parse TRL's configs, and the demo's options read ``EchoGRPOConfig``'s own
fields: building any of these parsers imports TRL, transformers and torch (about 12 s of CPU). Their ``--help``
pages are therefore kept as text files in ``echo_trl/help/``, rendered from those same parsers at a fixed width
by :func:`write_pages` (``python -m echo_trl.help_pages``), and a test renders them again and compares, so a
page never drifts from its parser. The short pages of ``train`` and ``sft`` put the flags ECHO adds first and
end with the line naming ``--help-all`` (the full parser, every TRL / transformers flag, rendered live).

This module imports nothing heavy: printing a page costs what starting Python costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import sys
import typing
from collections.abc import Sequence
from pathlib import Path

#: Where the rendered pages live (package data).
PAGES_DIR = Path(__file__).with_name("help")

#: Columns the pages are rendered at (a terminal's width would make them differ between machines).
WIDTH = 100

#: page name -> "module:function" returning the page's text, rendered from the command's real parser.
PAGES = {
    "train": "echo_trl.commands.train:short_help",
    "sft": "echo_trl.commands.sft:short_help",
    "demo": "echo_trl.demo.options:render_help",
}

HELP_FLAGS = ("-h", "--help")


def wants_help(argv: Sequence[str]) -> bool:
    """``-h`` / ``--help`` anywhere before a ``--`` (argparse answers them wherever they stand)."""
    args = list(argv)
    args = args[: args.index("--")] if "--" in args else args
    return any(a in HELP_FLAGS for a in args)


def page(name: str) -> str:
    """The stored text of page ``name``."""
    return (PAGES_DIR / f"{name}.txt").read_text(encoding="utf-8")


def print_page(name: str) -> int:
    """Print page ``name`` to stdout; the exit code of a ``--help``."""
    sys.stdout.write(page(name))
    sys.stdout.flush()
    return 0


def render(parser: argparse.ArgumentParser) -> str:
    """``parser``'s help at :data:`WIDTH` columns, descriptions kept as written."""
    parser.formatter_class = functools.partial(argparse.RawDescriptionHelpFormatter, width=WIDTH)
    return parser.format_help()


def field_group(source: type, names: Sequence[str], title: str) -> type:
    """A dataclass holding fields ``names`` of ``source`` (same types, defaults and help) shown under ``title``:
    HfArgumentParser puts a dataclass with ``_argument_group_name`` in its own argument group (its documented
    way of grouping flags), so a short page can list a chosen subset of a config's flags in a chosen order."""
    hints = typing.get_type_hints(source)
    fields = {f.name: f for f in dataclasses.fields(source)}
    specs = []
    for name in names:
        f = fields[name]
        kwargs: dict = {"metadata": f.metadata}
        if f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default_factory"] = f.default_factory
        specs.append((name, hints[name], dataclasses.field(**kwargs)))
    group = dataclasses.make_dataclass(f"{source.__name__}Help", specs)
    group._argument_group_name = title
    return group


def own_fields(config: type) -> list[str]:
    """The fields ``config`` declares itself (ECHO's), not those it inherits from TRL, in declaration order."""
    fields = {f.name for f in dataclasses.fields(config) if f.init}
    return [name for name in config.__dict__.get("__annotations__", {}) if name in fields]


def more_flags_line(command: str, shown: int, total: int, what: str) -> str:
    """The closing line of a short page: how many flags it left out and how to see them."""
    return f"{total - shown} more flags ({what}): `{command} --help-all`.\n"


def rendered(name: str) -> str:
    """Page ``name`` rendered now from its parser (imports what the parser needs)."""
    module, function = PAGES[name].split(":")
    return getattr(importlib.import_module(module), function)()


def write_pages() -> list[Path]:
    """Render every page into :data:`PAGES_DIR` (run after changing a flag: the pages test says so)."""
    PAGES_DIR.mkdir(exist_ok=True)
    written = []
    for name in PAGES:
        path = PAGES_DIR / f"{name}.txt"
        path.write_text(rendered(name), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover
    for p in write_pages():
        print(f"wrote {p}")
