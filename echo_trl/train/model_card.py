"""The ECHO part of a trained model's card.

TRL's ``create_model_card`` renders its template (base model, tags, framework versions, the
trainer's paper citation). :func:`add_echo_section` adds what a reader of an ECHO model needs:
the world-model settings (lambda, its schedule, the target tokens, the normalization), the final
world-model metrics of the run and the Agent World Model / GRPO citations, and replaces the
template's placeholders for a local base model (``[None](https://huggingface.co/None)``,
``pipeline(model="None")``). :func:`add_sft_section` does the same for the SFT stage (``EchoSFTTrainer``):
which stage and which role weights produced the model.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from ..data.citations import AWM_CITATION
from ..data.hub import is_hub_id
from ..tokens.template.chat_template import template_label
from .trl_compat import grpo_citation

__all__ = ["echo_card_section", "add_echo_section", "final_metrics", "sft_card_section", "add_sft_section"]

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


def echo_card_section(args, log_history: list[dict[str, Any]], chat_template: str | dict | None = None) -> str:
    """Markdown: ECHO settings (the chat template rendered with among them), final world-model metrics and the
    AWM / GRPO citations."""
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
        ("chat template", template_label(chat_template, getattr(args, "chat_template_path", None))),
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
    grpo = grpo_citation()
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
    base = f"`{base_model}`" if base_model else "a base model"
    text = text.replace("[None](https://huggingface.co/None)", base)
    text = text.replace('model="None"', f'model="{model_ref}"')

    def unlink(m: re.Match) -> str:
        name, target = m.group(1), m.group(2)
        local = name == target and (not is_hub_id(name) or Path(name).exists())
        return f"`{name}`" if local else m.group(0)

    return _HUB_LINK.sub(unlink, text)


def add_echo_section(
    readme: str | Path,
    args,
    log_history: list[dict[str, Any]],
    *,
    base_model: str | None = None,
    chat_template: str | dict | None = None,
) -> Path:
    """Insert (or replace) the ECHO section of the card at ``readme``, before TRL's framework versions,
    and fill TRL's placeholders (``base_model``: the name or path the model was loaded from; ``chat_template``:
    the template the run rendered with)."""
    section = echo_card_section(args, log_history, chat_template)
    return insert_section(readme, SECTION_MARKER, section, args, base_model=base_model)


def insert_section(readme: str | Path, marker: str, section: str, args, *, base_model: str | None = None) -> Path:
    """Insert (or replace) the section that starts with ``marker`` before TRL's framework versions, and fill
    TRL's placeholders."""
    path = Path(readme)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if marker in text:  # a card re-written at a later checkpoint: drop the old section
        start = text.index(marker)
        end = text.find("### Framework versions", start)
        text = text[:start] + (text[end:] if end >= 0 else "")
    anchor = text.find("### Framework versions")
    text = text[:anchor] + section + "\n" + text[anchor:] if anchor >= 0 else text + "\n" + section
    model_ref = getattr(args, "hub_model_id", None) or str(path.parent)
    path.write_text(fill_placeholders(text, base_model=base_model, model_ref=model_ref), encoding="utf-8")
    return path


SFT_SECTION_MARKER = "## ECHO SFT stage"
#: SFT metrics reported in the card (the last logged value of each).
SFT_METRICS = ("eval_sft/ce_env", "eval_sft/ce_action", "sft/ce_env", "sft/ce_action", "sft/weighted_ce", "loss")


def sft_card_section(
    args, log_history: list[dict[str, Any]], reward_filter: str | None = None, chat_template: str | dict | None = None
) -> str:
    """Markdown: the stage (SFT with observation supervision), its role weights, episode filter and final metrics."""
    rows = [
        ("stage", "SFT (`EchoSFTTrainer`), before ECHO-GRPO"),
        ("tool-message content tokens (`observation_weight`)", f"{args.observation_weight:g}"),
        ("assistant tokens TRL trains (`action_weight`)", f"{args.action_weight:g}"),
        ("other tokens", "TRL's mask (harness warnings: 0)"),
        ("target tokens (`world_loss_target`)", args.world_loss_target),
        ("normalization", "sum of weighted CE / sum of weights (over the accumulation window and processes)"),
        ("episodes (`min_reward`)", "all" if args.min_reward is None else f"reward >= {args.min_reward:g}"),
        ("world term on every episode (`world_all_episodes`)", str(bool(args.world_all_episodes))),
        ("max world-model tokens per observation", str(args.max_world_model_tokens or "all")),
        ("chat template", template_label(chat_template, getattr(args, "chat_template_path", None))),
    ]
    lines = [
        SFT_SECTION_MARKER,
        "",
        "Supervised fine-tuning with echo_trl's `EchoSFTTrainer` (TRL's `SFTTrainer` with role weights): "
        "cross-entropy on the agent's tokens and, weighted by `observation_weight`, on the environment's output "
        "tokens (observation supervision), divided by the weight sum:",
        "",
        "    L = sum_t w_t CE_t / sum_t w_t",
        "",
        "| setting | value |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
        "",
    ]
    if reward_filter:
        lines += [f"Episodes: {reward_filter}.", ""]
    last: dict[str, tuple[int, float]] = {}
    for entry in log_history:
        for key in SFT_METRICS:
            value = _finite(entry.get(key))
            if value is not None:
                last[key] = (int(entry.get("step") or 0), value)
    if last:
        lines += ["### Final SFT metrics", "", "| metric | value | step |", "|---|---|---|"]
        lines += [f"| `{k}` | {v:.4g} | {step} |" for k in SFT_METRICS if k in last for step, v in [last[k]]]
        lines.append("")
    lines += ["### Cite Agent World Model", "", "```bibtex", AWM_CITATION, "```", ""]
    return "\n".join(lines)


def add_sft_section(
    readme: str | Path,
    args,
    log_history: list[dict[str, Any]],
    *,
    base_model: str | None = None,
    reward_filter: str | None = None,
    chat_template: str | dict | None = None,
) -> Path:
    """Insert (or replace) the SFT stage's section of the card at ``readme`` (see :func:`add_echo_section`)."""
    section = sft_card_section(args, log_history, reward_filter, chat_template)
    return insert_section(readme, SFT_SECTION_MARKER, section, args, base_model=base_model)
