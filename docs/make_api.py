"""Write ``docs/api.md``, the API reference, from the docstrings of echo_trl's public objects.

    python docs/make_api.py            # rewrite docs/api.md
    python docs/make_api.py --check    # exit 1 if docs/api.md is out of date (CI)

Public = what ``echo_trl/__init__.py`` exports (``__all__``) plus the modules listed below; each
object gets its signature and docstring; ``EchoGRPOConfig`` also gets a table of its ECHO fields
with their defaults and ``help`` texts (the same text ``echo-trl train --help`` prints).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "api.md"

#: (module, names) documented besides ``echo_trl.__all__``; each listed by name.
EXTRA = [
    (
        "echo_trl.data.awm_agent",
        [
            "list_tools_reply",
            "meta_tool_schemas",
            "parse_tool_calls",
            "parse_call_tool_arguments",
            "next_action",
            "action_for_call",
            "robust_json_loads",
            "to_awm_agent_trajectory",
        ],
    ),
    ("echo_trl.data.conversations", ["conversation_to_trajectory"]),
    ("echo_trl.data.build", ["trajectories_to_dataset"]),
    ("echo_trl.data.store", ["save_dataset", "validate_dataset"]),
    ("echo_trl.trainer", ["recorded_reward", "no_reward"]),
    ("echo_trl.outputs", ["check_output_dir", "atomic_output_dir", "output_lock"]),
    ("echo_trl.tokens.cache", ["tokenize_dataset", "row_tokens", "tokenizer_fingerprint"]),
    ("echo_trl.prefix.attention", ["enable_prefix_tree_attention", "shared_logps"]),
    ("echo_trl.prefix.order", ["prefix_grouped_order"]),
    ("echo_trl.train.behavior", ["add_initial_logprobs", "model_fingerprint"]),
    ("echo_trl.train.model_card", ["echo_card_section", "add_echo_section", "final_metrics"]),
    ("echo_trl.data.card", ["dataset_card"]),
    ("echo_trl.train.world_eval", ["evaluate_world_model", "trajectory_env_nll"]),
    (
        "echo_trl.envs.awm.environment",
        ["awm_environment_factory", "awm_environment_factories", "awm_task_dataset", "close_environments"],
    ),
    ("echo_trl.envs.awm.pool", ["ServerPool", "choose_slot"]),
    ("echo_trl.envs.awm.agent_format", ["awm_agent_environment_factory", "agent_reply"]),
    ("echo_trl.envs.awm.policy", ["normalize_timestamps"]),
    ("echo_trl.envs.awm.scenario", ["ScenarioSource"]),
]


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return sig if len(sig) < 400 else "(...)"


def _doc(obj) -> str:
    return inspect.cleandoc(obj.__doc__) if obj.__doc__ else "*(no docstring)*"


def _config_fields(cls) -> list[str]:
    from trl import GRPOConfig

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
    import echo_trl

    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python docs/make_api.py`; do not edit by hand.",
        "",
        "## `echo_trl`",
        "",
    ]
    for name in echo_trl.__all__:
        obj = getattr(echo_trl, name)
        if inspect.ismodule(obj) or not (callable(obj) or inspect.isclass(obj)):
            continue
        lines += _entry(f"echo_trl.{name}", obj)
    for module_name, names in EXTRA:
        module = importlib.import_module(module_name)
        lines += [f"## `{module_name}`", "", inspect.cleandoc(module.__doc__ or "").split("\n\n")[0], ""]
        for name in names:
            lines += _entry(f"{module_name}.{name}", getattr(module, name))
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
