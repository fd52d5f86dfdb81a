"""Write ``docs/api.md``, the API reference, from the docstrings of echo_trl's public objects.

    python docs/make_api.py            # rewrite docs/api.md
    python docs/make_api.py --check    # exit 1 if docs/api.md is out of date (CI)

The package says what is public: ``echo_trl.__all__``, then the ``__all__`` of every module of the package
that declares one (a name documented once: one ``echo_trl`` exports is not repeated under its module). Each
class and function gets its signature and docstring; ``EchoGRPOConfig`` also gets a table of its ECHO fields
with their defaults and ``help`` texts (the same text ``echo-trl train --help`` prints).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

from trl import GRPOConfig

import echo_trl

OUT = Path(__file__).resolve().parent / "api.md"


def _declares_all(node: ast.stmt) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]  # (Ann/Aug)Assign
    return any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets)


def public_modules(package) -> list[str]:
    """The modules of ``package`` that declare ``__all__`` at top level (read from their source: nothing is
    imported to find them), the package itself first."""
    root = Path(package.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if any(_declares_all(node) for node in ast.parse(path.read_text(encoding="utf-8")).body):
            parts = path.relative_to(root.parent).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(found, key=lambda name: (name != package.__name__, name))


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return sig if len(sig) < 400 else "(...)"


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else "*(no docstring)*"


def _config_fields(cls) -> list[str]:
    base = {f.name for f in dataclasses.fields(GRPOConfig)}
    rows = ["| field | default | help |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in base:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        text = " ".join(f.metadata.get("help", "").split()).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{default!r}` | {text} |")
    return rows


def _entry(qualname: str, obj) -> list[str]:
    kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "object"
    lines = [f"### `{qualname}`", ""]
    if kind in ("class", "function"):
        name = qualname.rsplit(".", 1)[-1]
        sig = _signature(obj)
        lines += ["```python", f"{kind if kind == 'class' else 'def'} {name}{sig}", "```", ""]
    lines += [_doc(obj), ""]
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and obj.__name__ == "EchoGRPOConfig":
        lines += ["ECHO fields (every `trl.GRPOConfig` field is accepted too):", "", *_config_fields(obj), ""]
    return lines


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python docs/make_api.py`; do not edit by hand.",
        "",
    ]
    documented: set[int] = set()
    for module_name in public_modules(echo_trl):
        module = importlib.import_module(module_name)
        entries = []
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj) and id(obj) not in documented:  # classes and functions (not constants)
                documented.add(id(obj))
                entries += _entry(f"{module_name}.{name}", obj)
        if entries:
            summary = inspect.cleandoc(module.__doc__ or "").split("\n\n")[0]
            lines += [f"## `{module_name}`", "", summary, "", *entries]
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
