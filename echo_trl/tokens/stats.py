"""Exact token accounting per role: how much of an agent trajectory the world model can learn from."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..progress import progress
from ..roles import MESSAGE_ROLES
from .tokenization import tokenize_rows

#: The roles counted (``RoleTokens.counts``: the template's tool-message wrapper counts as context).
ROLES = tuple(r.value for r in MESSAGE_ROLES)


def _summary(tokens: dict[str, int], episodes: int) -> dict[str, Any]:
    learnable = tokens["action"] + tokens["env_output"]
    return {
        "episodes": episodes,
        "tokens": dict(tokens),
        "total_tokens": sum(tokens.values()),
        "env_share_of_learnable": tokens["env_output"] / learnable if learnable else 0.0,
        "env_to_action_ratio": tokens["env_output"] / tokens["action"] if tokens["action"] else None,
    }


def token_stats(
    tokenizer, dataset, *, max_length: int | None = None, batch_size: int = 64, show_progress: bool | None = None
) -> dict[str, Any]:
    """Tokens per role over ``dataset`` (rows of the ECHO schema), overall and per scenario.

    "Learnable" tokens are those a loss trains on: action (GRPO) and env_output (ECHO).
    """
    totals = dict.fromkeys(ROLES, 0)
    per: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(ROLES, 0))
    episodes: dict[str, int] = defaultdict(int)
    truncated_tokens = truncated_episodes = 0
    n = len(dataset)
    for start in progress(
        range(0, n, batch_size),
        desc="tokenizing",
        unit="batch",
        total=(n + batch_size - 1) // batch_size,
        enable=show_progress,
    ):
        rows = dataset.select(range(start, min(start + batch_size, n)))
        results = tokenize_rows(tokenizer, list(rows), list(range(start, start + len(rows))), max_length=max_length)
        for row, rt in zip(rows, results, strict=True):
            counts = rt.counts()
            scen = row["scenario"]
            episodes[scen] += 1
            for role in ROLES:
                totals[role] += counts[role]
                per[scen][role] += counts[role]
            truncated_tokens += rt.truncated_tokens
            truncated_episodes += rt.truncated_tokens > 0
    out = _summary(totals, n)
    if max_length is not None:
        out["max_length"] = max_length
        out["truncated_episodes"] = truncated_episodes
        out["truncated_tokens"] = truncated_tokens
    out["by_scenario"] = {s: _summary(per[s], episodes[s]) for s in sorted(per)}
    return out


def format_stats(stats: dict[str, Any]) -> str:
    """A human-readable table of :func:`token_stats`."""
    lines = [f"episodes: {stats['episodes']}   tokens: {stats['total_tokens']}", ""]
    lines.append(f"{'role':<12}{'tokens':>12}{'share':>9}")
    total = stats["total_tokens"] or 1
    for role in ROLES:
        t = stats["tokens"][role]
        lines.append(f"{role:<12}{t:>12}{t / total:>9.1%}")
    ratio = stats["env_to_action_ratio"]
    lines += [
        "",
        f"env share of learnable tokens: {stats['env_share_of_learnable']:.1%}",
        f"env / action ratio: {ratio:.2f}" if ratio is not None else "env / action ratio: n/a (no actions)",
    ]
    if "max_length" in stats:
        lines.append(
            f"truncated at max_length={stats['max_length']}: {stats['truncated_episodes']} episodes, "
            f"{stats['truncated_tokens']} tokens cut"
        )
    if len(stats["by_scenario"]) > 1:
        lines += ["", f"{'scenario':<32}{'episodes':>9}{'env':>10}{'action':>9}{'env share':>11}"]
        for s, v in stats["by_scenario"].items():
            lines.append(
                f"{s:<32}{v['episodes']:>9}{v['tokens']['env_output']:>10}{v['tokens']['action']:>9}"
                f"{v['env_share_of_learnable']:>11.1%}"
            )
    return "\n".join(lines)
