"""Write ``docs/api.md``, the API reference, from the docstrings of echo_trl's public names.

    python docs/make_api.py            # rewrite docs/api.md
    python docs/make_api.py --check    # exit 1 if docs/api.md is out of date (CI)

Public means exported by a public package: ``echo_trl.__all__`` and ``echo_trl.envs.awm.__all__``, nothing
else (the modules behind them are internals and may move). Each entry is named by the package that exports
it, so the reference does not change when an implementation moves between modules. Each class and function
gets its signature and docstring, a constant its value; the two configs also get a table of the fields they
add to TRL's config, with their defaults and ``help`` texts (the same text ``--help`` prints).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

from trl import GRPOConfig, SFTConfig

OUT = Path(__file__).resolve().parent / "api.md"
#: The packages whose ``__all__`` is the public API, in the order documented.
PUBLIC_PACKAGES = ("echo_trl", "echo_trl.envs.awm")
#: Config classes whose own fields get a table: the class name and the TRL config it extends.
CONFIG_BASES = {"EchoGRPOConfig": GRPOConfig, "EchoSFTConfig": SFTConfig}


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return sig if len(sig) < 400 else "(...)"


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else "*(no docstring)*"


def _config_fields(cls, base_cls) -> list[str]:
    base = {f.name for f in dataclasses.fields(base_cls)}
    rows = ["| field | default | help |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in base:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        text = " ".join(f.metadata.get("help", "").split()).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{default!r}` | {text} |")
    return rows


def _entry(qualname: str, obj) -> list[str]:
    lines = [f"### `{qualname}`", ""]
    if not callable(obj):  # a constant: its value when short, else its type
        value = repr(obj)
        kind = f"`{type(obj).__module__}.{type(obj).__qualname__}`"
        return [*lines, f"A constant: `{value}`." if len(value) <= 100 else f"A constant of type {kind}.", ""]
    name = qualname.rsplit(".", 1)[-1]
    keyword = "class" if inspect.isclass(obj) else "def"
    lines += ["```python", f"{keyword} {name}{_signature(obj)}", "```", "", _doc(obj), ""]
    base_cls = CONFIG_BASES.get(getattr(obj, "__name__", ""))
    if base_cls is not None and dataclasses.is_dataclass(obj):
        title = f"Fields it adds (every `trl.{base_cls.__name__}` field is accepted too):"
        lines += [title, "", *_config_fields(obj, base_cls), ""]
    return lines


def render() -> str:
    lines = [
        "# API reference",
        "",
        "The public API: what `echo_trl` and `echo_trl.envs.awm` export (their `__all__`). Generated from the",
        "docstrings by `python docs/make_api.py`; do not edit by hand.",
        "",
    ]
    for package_name in PUBLIC_PACKAGES:
        package = importlib.import_module(package_name)
        summary = inspect.cleandoc(package.__doc__ or "").split("\n\n")[0]
        lines += [f"## `{package_name}`", "", summary, ""]
        for name in package.__all__:
            lines += _entry(f"{package_name}.{name}", getattr(package, name))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is out of date: run python docs/make_api.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
