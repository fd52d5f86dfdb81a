"""The cards echo_trl writes: the ECHO part of a trained model's card and a built dataset's card.

TRL's ``create_model_card`` renders its template (base model, tags, framework versions, the
trainer's paper citation). :func:`add_echo_section` adds what a reader of an ECHO model needs:
the world-model settings (lambda, its schedule, the target tokens, the normalization), the final
world-model metrics of the run and the Agent World Model / GRPO citations, and replaces the
template's placeholders for a local base model (``[None](https://huggingface.co/None)``,
``pipeline(model="None")``). :func:`dataset_card` is the ``README.md`` of a built dataset.
Both cite ECHO with the one :data:`ECHO_CITATION` (also the README's).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ..roles import MESSAGE_ROLES

ECHO_CITATION = """@article{echo2026,
    title   = {{ECHO: Environment Cross-entropy Hybrid Objective}},
    journal = {arXiv preprint arXiv:2605.24517},
    year    = 2026,
}"""

#: ECHO's paper, in the shape of TRL's ``_paper`` (the template's "introduced in" line and citation).
ECHO_PAPER = {
    "title": "ECHO: Environment Cross-entropy Hybrid Objective",
    "id": "2605.24517",
    "citation": ECHO_CITATION,
}

AWM_CITATION = """@article{wang2026agentworldmodelinfinity,
    title   = {{Agent World Model: Infinity Synthetic Environments for Agentic Reinforcement Learning}},
    author  = {Zhaoyang Wang and Canwen Xu and Boyi Liu and Yite Wang and Siwei Han and Zhewei Yao and Huaxiu Yao
               and Yuxiong He},
    journal = {arXiv preprint arXiv:2602.10090},
    year    = 2026,
}"""

#: Metrics reported in the card (the last logged value of each), in this order.
FINAL_METRICS = (
    "eval_world/ce_env",
    "world/ce_env",
    "world/loss_unscaled",
    "world/coeff",
    "world/tokens_env",
    "world/tokens_action",
    "world/filtered_frac",
    "reward",
)

SECTION_MARKER = "## ECHO training"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 scenario``, ``2 scenarios`` (``many`` for irregular plurals)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


# --------------------------------------------------------------------------------------------
# Model card


def _schedule(args) -> str:
    s = args.world_model_coeff_schedule
    if s == "linear_decay":
        steps = args.world_model_coeff_steps[0] if args.world_model_coeff_steps else "the whole run"
        return f"linear_decay to {args.world_model_coeff_end:g} over {steps} steps"
    if s == "step_decay":
        pairs = ", ".join(
            f"{v:g} from step {k}"
            for k, v in zip(args.world_model_coeff_steps, args.world_model_coeff_values, strict=True)
        )
        return f"step_decay ({pairs})"
    return "constant"


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def final_metrics(log_history: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """The last finite logged value of each of :data:`FINAL_METRICS`, with the step it was logged at.

    TRL logs ``None`` (every reward function returned None) and NaN as they come; a card shows numbers only.
    """
    out: dict[str, tuple[int, float]] = {}
    for entry in log_history:
        for key in FINAL_METRICS:
            value = _finite(entry.get(key))
            if value is not None:
                out[key] = (int(entry.get("step") or 0), value)
    return {k: out[k] for k in FINAL_METRICS if k in out}


def echo_card_section(args, log_history: list[dict[str, Any]]) -> str:
    """Markdown: ECHO settings, final world-model metrics and the AWM / GRPO citations."""
    policy = f"GRPO (TRL, loss_type={args.loss_type})" if args.use_policy_loss else "off (verifier-free ECHO)"
    filters = {
        k: getattr(args, k)
        for k in ("wm_filter_min_valid_tool_call_pct", "wm_filter_min_parse_clean_pct", "wm_filter_min_correct_pct")
        if getattr(args, k)
    }
    rows = [
        ("λ (`world_model_coeff`)", f"{args.world_model_coeff:g}"),
        ("λ schedule (`world_model_coeff_schedule`)", _schedule(args)),
        ("target tokens (`world_loss_target`)", args.world_loss_target),
        ("normalization (`world_loss_normalization`)", args.world_loss_normalization),
        ("world-loss temperature (`world_loss_temperature`)", f"{args.world_loss_temperature:g}"),
        ("policy term", policy),
        (
            "behaviour policy of recordings without log-probs (`behavior_policy`)",
            getattr(args, "behavior_policy", "current") if args.use_policy_loss else "-",
        ),
        ("max world-model tokens per observation", str(args.max_world_model_tokens or "all")),
        ("world-term rollout filters", ", ".join(f"{k}={v:g}" for k, v in filters.items()) or "none"),
    ]
    lines = [
        SECTION_MARKER,
        "",
        "Trained with echo_trl's `EchoGRPOTrainer` ([ECHO](https://arxiv.org/abs/2605.24517)): GRPO on the "
        "agent's action tokens plus λ × cross-entropy on the environment's output tokens (tool results), from "
        "the same forward pass:",
        "",
        "    L = L_GRPO(action tokens) + λ · CE(env_output tokens)",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
    ]
    metrics = final_metrics(log_history)
    if metrics:
        lines += [
            "### Final world-model metrics",
            "",
            "`ce_env` is the cross-entropy (nats/token) on env-output tokens; `eval_world/ce_env` is on "
            "held-out trajectories.",
            "",
            "| metric | value | step |",
            "|---|---|---|",
        ]
        lines += [f"| `{k}` | {v:.4g} | {step} |" for k, (step, v) in metrics.items()]
        lines.append("")
    # ECHO is cited below, as the trainer's paper; its policy term is GRPO (TRL's card cites only the trainer)
    from trl import GRPOTrainer

    grpo = getattr(GRPOTrainer, "_paper", {}).get("citation")
    lines += [
        "### Cite Agent World Model and GRPO",
        "",
        "```bibtex",
        AWM_CITATION,
        *([grpo] if grpo else []),
        "```",
        "",
    ]
    return "\n".join(lines)


_HUB_LINK = re.compile(r"\[([^\]\n]+)\]\(https://huggingface\.co/(?:datasets/)?([^)\s]+)\)")


def fill_placeholders(text: str, *, base_model: str | None, model_ref: str) -> str:
    """TRL's template with the base model named and links only to what is on the Hub.

    TRL writes ``[None](https://huggingface.co/None)`` when the base model is a local directory and
    ``pipeline(model="None")`` without a ``hub_model_id``; a local dataset path gets a Hub link too.
    """
    from ..commands.loading import is_hub_id

    base = f"`{base_model}`" if base_model else "a base model"
    text = text.replace("[None](https://huggingface.co/None)", base)
    text = text.replace('model="None"', f'model="{model_ref}"')

    def unlink(m: re.Match) -> str:
        name, target = m.group(1), m.group(2)
        local = name == target and (not is_hub_id(name) or Path(name).exists())
        return f"`{name}`" if local else m.group(0)

    return _HUB_LINK.sub(unlink, text)


def add_echo_section(
    readme: str | Path, args, log_history: list[dict[str, Any]], *, base_model: str | None = None
) -> Path:
    """Insert (or replace) the ECHO section of the card at ``readme``, before TRL's framework versions,
    and fill TRL's placeholders (``base_model``: the name or path the model was loaded from)."""
    path = Path(readme)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if SECTION_MARKER in text:  # a card re-written at a later checkpoint: drop the old section
        start = text.index(SECTION_MARKER)
        end = text.find("### Framework versions", start)
        text = text[:start] + (text[end:] if end >= 0 else "")
    section = echo_card_section(args, log_history)
    anchor = text.find("### Framework versions")
    text = text[:anchor] + section + "\n" + text[anchor:] if anchor >= 0 else text + "\n" + section
    model_ref = getattr(args, "hub_model_id", None) or str(path.parent)
    path.write_text(fill_placeholders(text, base_model=base_model, model_ref=model_ref), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Dataset card


def role_counts(ds) -> dict[str, dict[str, int]]:
    """Messages and characters per role (tokenizer-free; ``echo-trl stats`` counts tokens)."""
    counts: dict[str, dict[str, int]] = {r.value: {"messages": 0, "chars": 0} for r in MESSAGE_ROLES}
    for row in ds:
        for m in row["prompt"]:
            counts["context"]["messages"] += 1
            counts["context"]["chars"] += len(m["content"] or "")
        for m, warns in zip(row["completion"], row["warnings"], strict=True):
            role = "action" if m["role"] == "assistant" else "env_output" if m["role"] == "tool" else "context"
            counts[role]["messages"] += 1
            counts[role]["chars"] += len(m["content"] or "") + sum(
                len(c["function"]["arguments"]) + len(c["function"]["name"]) for c in m["tool_calls"] or []
            )
            counts["warning"]["messages"] += len(warns)
            counts["warning"]["chars"] += sum(len(w) for w in warns)
    return counts


def dataset_card(ds, *, title: str = "ECHO trajectories from Agent World Model episodes", skipped: int = 0) -> str:
    """The ``README.md`` written next to a built dataset (and pushed with it to the Hub)."""
    by_scenario: dict[str, Counter] = defaultdict(Counter)
    for scenario, group, reward in zip(ds["scenario"], ds["group_id"], ds["reward"], strict=True):
        c = by_scenario[scenario]
        c["episodes"] += 1
        c[f"group:{group}"] = 1
        c["reward_sum"] += reward
    roles = role_counts(ds)
    formats = ", ".join(f"`{f}`" for f in sorted(set(ds["format"] if "format" in ds.column_names else [])))
    scen_rows = "\n".join(
        f"| {s} | {c['episodes']} | {sum(1 for k in c if k.startswith('group:'))} | {c['reward_sum'] / c['episodes']:.3f} |"
        for s, c in sorted(by_scenario.items())
    )
    role_rows = "\n".join(f"| `{r}` | {v['messages']} | {v['chars']} |" for r, v in roles.items())
    skipped_note = f", {plural(skipped, 'invalid record')} skipped (see skipped.jsonl)" if skipped else ""
    return f"""---
license: cc-by-4.0
tags:
- echo-trl
- agent
- tool-use
- reinforcement-learning
- agent-world-model
pretty_name: "{title}"
---

# {title}

Agent trajectories for echo_trl ([ECHO](https://arxiv.org/abs/2605.24517): GRPO on the agent's action tokens
plus lambda * cross-entropy on the environment's observation tokens), in TRL's conversational
prompt-completion format. Built with `echo-trl build-dataset`: {plural(len(ds), "episode")},
{plural(len(by_scenario), "scenario")}{skipped_note}.
Conversation format: {formats or "`chat-template`"} (see the `format` column).

## Schema

| column | type | meaning |
|---|---|---|
| `prompt` | list of messages | system prompt and the user's task (context) |
| `completion` | list of messages | assistant tool calls and `tool` messages, in order |
| `tools` | list of JSON strings | the tool schemas the agent could call |
| `warnings` | list (per completion message) of lists of strings | harness warnings, kept out of the env output |
| `reward` | float | episode reward (AWM: complete 1.0, incomplete 0.1, format error -1.0, else 0.0) |
| `group_id` | string | `scenario/task_idx`: trajectories of the same task share it (GRPO groups) |
| `scenario`, `task_idx` | string, int | AWM provenance |
| `behavior_logprobs` | list of floats or null | per action token, when recorded at rollout time |
| `format` | string | conversation format: `chat-template` or `awm-agent` (the official AWM agent's) |

A tool call's `arguments` is stored as JSON text (Arrow needs one type per column).

## Roles

| role | source | loss |
|---|---|---|
| `context` | system prompt, tool schemas, task, chat-template scaffolding | none |
| `action` | assistant tool calls, with their end-of-turn token | GRPO |
| `env_output` | tool results, errors, verifier output | ECHO world-model cross-entropy |
| `warning` | harness warnings | excluded by default |

Counts (messages and characters; `echo-trl stats DATASET --tokenizer MODEL` gives exact tokens):

| role | messages | characters |
|---|---|---|
{role_rows}

## Scenarios

| scenario | episodes | tasks | mean reward |
|---|---|---|---|
{scen_rows}

## License and attribution

Derived from Agent World Model environments (AgentWorldModel-1K, Snowflake AI Research and
UNC-Chapel Hill, CC-BY-4.0, arXiv 2602.10090) where the scenarios come from there.

## Citation

```bibtex
{ECHO_CITATION}
{AWM_CITATION}
```
"""
