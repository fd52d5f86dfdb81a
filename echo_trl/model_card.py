"""The ECHO part of a trained model's card (``README.md``), added to the card TRL writes.

TRL's ``create_model_card`` renders its template (base model, tags, framework versions, the
trainer's paper citation). :func:`echo_card_section` adds what a reader of an ECHO model needs:
the world-model settings (lambda, its schedule, the target tokens, the normalization), the final
world-model metrics of the run, and the ECHO / Agent World Model citations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: ECHO's paper, in the shape of TRL's ``_paper`` (the template's "introduced in" line and citation).
ECHO_PAPER = {
    "title": "ECHO: Environment Cross-entropy Hybrid Objective",
    "id": "2605.24517",
    "citation": """@article{echo2026,
    title   = {{ECHO: Environment Cross-entropy Hybrid Objective}},
    journal = {arXiv preprint arXiv:2605.24517},
    year    = 2026,
}""",
}

AWM_CITATION = """@article{wang2026agentworldmodelinfinity,
    title   = {{Agent World Model: Infinity Synthetic Environments for Agentic Reinforcement Learning}},
    author  = {Zhaoyang Wang and Canwen Xu and Boyi Liu and Yite Wang and Siwei Han and Zhewei Yao and Huaxiu Yao
               and Yuxiong He},
    journal = {arXiv preprint arXiv:2602.10090},
    year    = 2026,
}"""

#: Metrics reported in the card (the last logged value of each), in this order.
FINAL_METRICS = ("eval_world/ce_env", "world/ce_env", "world/loss_unscaled", "world/coeff", "world/tokens_env",
                 "world/tokens_action", "world/filtered_frac", "reward")

SECTION_MARKER = "## ECHO training"


def _schedule(args) -> str:
    s = args.world_model_coeff_schedule
    if s == "linear_decay":
        steps = args.world_model_coeff_steps[0] if args.world_model_coeff_steps else "the whole run"
        return f"linear_decay to {args.world_model_coeff_end:g} over {steps} steps"
    if s == "step_decay":
        pairs = ", ".join(f"{v:g} from step {k}" for k, v in zip(args.world_model_coeff_steps,
                                                                   args.world_model_coeff_values, strict=True))
        return f"step_decay ({pairs})"
    return "constant"


def final_metrics(log_history: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """The last logged value of each of :data:`FINAL_METRICS`, with the step it was logged at."""
    out: dict[str, tuple[int, float]] = {}
    for entry in log_history:
        for key in FINAL_METRICS:
            if key in entry:
                out[key] = (int(entry.get("step", 0)), float(entry[key]))
    return {k: out[k] for k in FINAL_METRICS if k in out}


def echo_card_section(args, log_history: list[dict[str, Any]]) -> str:
    """Markdown: ECHO settings, final world-model metrics and the ECHO / AWM citations."""
    policy = f"GRPO (TRL, loss_type={args.loss_type})" if args.use_policy_loss else "off (verifier-free ECHO)"
    filters = {k: getattr(args, k) for k in ("wm_filter_min_valid_tool_call_pct", "wm_filter_min_parse_clean_pct",
                                             "wm_filter_min_correct_pct") if getattr(args, k)}
    rows = [("λ (`world_model_coeff`)", f"{args.world_model_coeff:g}"),
            ("λ schedule (`world_model_coeff_schedule`)", _schedule(args)),
            ("target tokens (`world_loss_target`)", args.world_loss_target),
            ("normalization (`world_loss_normalization`)", args.world_loss_normalization),
            ("world-loss temperature (`world_loss_temperature`)", f"{args.world_loss_temperature:g}"),
            ("policy term", policy),
            ("max world-model tokens per observation", str(args.max_world_model_tokens or "all")),
            ("world-term rollout filters", ", ".join(f"{k}={v:g}" for k, v in filters.items()) or "none")]
    lines = [SECTION_MARKER, "",
             "Trained with [echo_trl](https://arxiv.org/abs/2605.24517)'s `EchoGRPOTrainer`: GRPO on the agent's "
             "action tokens plus λ × cross-entropy on the environment's output tokens (tool results), from the "
             "same forward pass:", "", "    L = L_GRPO(action tokens) + λ · CE(env_output tokens)", "",
             "| setting | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows], ""]
    metrics = final_metrics(log_history)
    if metrics:
        lines += ["### Final world-model metrics", "",
                  "`ce_env` is the cross-entropy (nats/token) on env-output tokens; `eval_world/ce_env` is on "
                  "held-out trajectories.", "", "| metric | value | step |", "|---|---|---|"]
        lines += [f"| `{k}` | {v:.4g} | {step} |" for k, (step, v) in metrics.items()]
        lines.append("")
    # ECHO's policy term is GRPO: cite it too (TRL's card cites only the trainer's paper)
    from trl import GRPOTrainer

    grpo = getattr(GRPOTrainer, "_paper", {}).get("citation")
    lines += ["### Cite ECHO and Agent World Model", "", "```bibtex", ECHO_PAPER["citation"], AWM_CITATION,
              *([grpo] if grpo else []), "```", ""]
    return "\n".join(lines)


def add_echo_section(readme: str | Path, args, log_history: list[dict[str, Any]]) -> Path:
    """Insert (or replace) the ECHO section of the card at ``readme``, before TRL's framework versions."""
    path = Path(readme)
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if SECTION_MARKER in text:  # a card re-written at a later checkpoint: drop the old section
        start = text.index(SECTION_MARKER)
        end = text.find("### Framework versions", start)
        text = text[:start] + (text[end:] if end >= 0 else "")
    section = echo_card_section(args, log_history)
    anchor = text.find("### Framework versions")
    text = text[:anchor] + section + "\n" + text[anchor:] if anchor >= 0 else text + "\n" + section
    path.write_text(text, encoding="utf-8")
    return path
