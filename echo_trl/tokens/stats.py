"""Exact token accounting per role: how much of an agent trajectory the world model can learn from."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..roles import MESSAGE_ROLES, Role
from .cache import IDS, row_tokens, tokenize_dataset
from .cache import ROLES as ROLE_COLUMN
from .tokenization import RoleTokens

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
    tokenizer,
    dataset,
    *,
    max_length: int | None = None,
    batch_size: int = 256,
    show_progress: bool | None = None,
    num_proc: int | None = None,
) -> dict[str, Any]:
    """Tokens per role over ``dataset`` (rows of the ECHO schema), overall and per scenario.

    Read from the token cache (:func:`~echo_trl.tokens.cache.tokenize_dataset`: built once, with ``num_proc``
    processes, and shared with training), counted one Arrow batch at a time (no row as Python objects).
    "Learnable" tokens are those a loss trains on: action (GRPO) and env_output (ECHO).
    """
    tokens = tokenize_dataset(dataset, tokenizer, show_progress=show_progress, num_proc=num_proc)
    totals = dict.fromkeys(ROLES, 0)
    per: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(ROLES, 0))
    episodes: dict[str, int] = defaultdict(int)
    n_codes = len(Role)
    columns = tokens.select_columns(["scenario", ROLE_COLUMN]).with_format("arrow")
    for table in columns.iter(batch_size=batch_size):
        scenarios = table.column("scenario").to_pylist()
        names = sorted(set(scenarios), key=str)
        code_of = {name: k for k, name in enumerate(names)}
        row_codes = np.asarray([code_of[s] for s in scenarios], dtype=np.int64)
        roles = pa.chunked_array(table.column(ROLE_COLUMN).chunks).combine_chunks()
        values = pc.list_flatten(roles).to_numpy(zero_copy_only=False).astype(np.int64)
        rows = pc.list_parent_indices(roles).to_numpy(zero_copy_only=False)
        counts = np.bincount(row_codes[rows] * n_codes + values, minlength=len(names) * n_codes)
        for name, k in code_of.items():
            c = counts[k * n_codes : (k + 1) * n_codes]
            by_role = _by_message_role(c)
            for role in ROLES:
                totals[role] += by_role[role]
                per[name][role] += by_role[role]
        for name in scenarios:
            episodes[name] += 1
    out = _summary(totals, len(tokens))
    if max_length is not None:
        cut = truncated(tokens, max_length)
        out["max_length"] = max_length
        out["truncated_episodes"] = len(cut)
        out["truncated_tokens"] = sum(full - len(kept) for _, full, kept in cut)
    out["by_scenario"] = {s: _summary(per[s], episodes[s]) for s in sorted(per, key=str)}
    return out


def _by_message_role(codes: np.ndarray) -> dict[str, int]:
    """Token counts per role code -> per message role (the tool-message wrapper counts as context, as
    ``RoleTokens.counts``)."""
    return {
        "context": int(codes[Role.CONTEXT.code] + codes[Role.OBSERVATION.code]),
        "action": int(codes[Role.ACTION.code]),
        "env_output": int(codes[Role.ENV_OUTPUT.code]),
        "warning": int(codes[Role.WARNING.code]),
    }


def truncated(tokens, max_length: int) -> list[tuple[int, int, RoleTokens | None]]:
    """``(row, tokens, cut)`` of each row of a token-cached dataset longer than ``max_length``: its tokens cut at a
    message end (``None`` when its prompt alone is longer). Only those rows are read as Python values."""
    lengths = pc.list_value_length(tokens.select_columns([IDS]).with_format("arrow")[IDS]).to_numpy()
    out = []
    for i in np.flatnonzero(lengths > max_length).tolist():
        full = row_tokens(tokens[i])
        kept = None if full.prompt_length > max_length else full.truncate(max_length)
        out.append((i, len(full), kept))
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
