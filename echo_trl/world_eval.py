"""Held-out environment-token cross-entropy: the paper's world-model metric (its Fig. 3).

Teacher-forced, in nats per env-output token, at temperature 1 (true cross-entropy): how well
the model predicts what the environment answered, given everything before it. Independent of
TRL and of the trainer (plain ``model(...)`` forward, the model's own LM head), so it also serves
as the reference the trainer's ``eval_world/ce_env`` is checked against.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch

from .progress import progress
from .tokenization import ENV_OUTPUT, WARNING, tokenize_with_roles


@torch.no_grad()
def trajectory_env_nll(model, tokenizer, row: dict[str, Any], *, max_length: int | None = None,
                       max_completion_length: int | None = None,
                       device: torch.device | str | None = None) -> dict[str, float]:
    """Summed negative log-likelihood and count of one trajectory's env-output (and warning) tokens.

    ``max_length`` cuts the whole trajectory, ``max_completion_length`` its completion, as the trainer
    does (both at a message end).
    """
    tokens = tokenize_with_roles(tokenizer, row)  # once; the cuts below reuse these tokens
    if max_completion_length is not None:
        tokens = tokens.truncate(tokens.prompt_length + max_completion_length)
    if max_length is not None:
        tokens = tokens.truncate(max_length)
    ids = torch.tensor([tokens.input_ids], dtype=torch.long, device=device or model.device)
    roles = torch.as_tensor(tokens.roles, dtype=torch.long)
    out = {"env_nll": 0.0, "env_tokens": 0, "warning_nll": 0.0, "warning_tokens": 0}
    targets = ((roles == ENV_OUTPUT) | (roles == WARNING)).nonzero().flatten()
    targets = targets[targets > 0]  # the first token has no context to be predicted from
    if targets.numel() == 0:
        return out
    # Only the logits that predict env/warning tokens (position t-1 predicts token t): memory stays
    # proportional to those tokens, whatever the vocabulary and sequence length.
    positions = (targets - 1).to(ids.device)
    logits = model(input_ids=ids, logits_to_keep=positions).logits[0].float()
    logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, targets.to(ids.device)].unsqueeze(-1)).squeeze(-1)
    nll = (-logps).cpu()
    is_env = roles[targets] == ENV_OUTPUT
    out["env_nll"], out["env_tokens"] = float(nll[is_env].sum()), int(is_env.sum())
    out["warning_nll"], out["warning_tokens"] = float(nll[~is_env].sum()), int((~is_env).sum())
    return out


def evaluate_world_model(model, tokenizer, rows: Iterable[dict[str, Any]], *, max_length: int | None = None,
                         max_completion_length: int | None = None,
                         show_progress: bool | None = None) -> dict[str, Any]:
    """Token-weighted held-out env CE over ``rows`` (trajectory rows), overall and per scenario.

    Returns ``{"ce_env", "tokens_env", "by_scenario": {scenario: {"ce_env", "tokens_env", "trajectories"}},
    "trajectories", "ce_warning", "tokens_warning"}`` (a CE is ``None`` when there are no such tokens).
    """
    was_training = model.training
    model.eval()
    totals = {"env_nll": 0.0, "env_tokens": 0, "warning_nll": 0.0, "warning_tokens": 0}
    scen: dict[str, dict[str, float]] = defaultdict(lambda: {"env_nll": 0.0, "env_tokens": 0, "trajectories": 0})
    n = 0
    try:
        rows = list(rows)
        for row in progress(rows, desc="eval env CE", unit="traj", enable=show_progress):
            r = trajectory_env_nll(model, tokenizer, row, max_length=max_length,
                                   max_completion_length=max_completion_length)
            for k in totals:
                totals[k] += r[k]
            s = scen[row.get("scenario") or ""]
            s["env_nll"] += r["env_nll"]
            s["env_tokens"] += r["env_tokens"]
            s["trajectories"] += 1
            n += 1
    finally:
        model.train(was_training)
    ce = lambda nll, k: (nll / k) if k else None  # noqa: E731
    return {
        "ce_env": ce(totals["env_nll"], totals["env_tokens"]),
        "tokens_env": totals["env_tokens"],
        "by_scenario": {name: {"ce_env": ce(v["env_nll"], v["env_tokens"]), "tokens_env": int(v["env_tokens"]),
                               "trajectories": int(v["trajectories"])} for name, v in sorted(scen.items())},
        "trajectories": n,
        "ce_warning": ce(totals["warning_nll"], totals["warning_tokens"]),
        "tokens_warning": totals["warning_tokens"],
    }
