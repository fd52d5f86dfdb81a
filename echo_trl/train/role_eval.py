"""Held-out cross-entropy per role: env-output tokens (the world model) and action tokens (the policy).

Teacher-forced, in nats per token, at temperature 1, token-weighted over all rows: what the two stages of
training (SFT, then ECHO-GRPO) each move. A plain ``model(...)`` forward with the model's own LM head over
the exact tokens of :func:`echo_trl.tokens.tokenization.tokenize_with_roles`, independent of both trainers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..roles import Role
from ..tokens.tokenization import tokenize_with_roles

__all__ = ["evaluate_role_ce"]

#: The roles reported, by name.
ROLES = {"env": Role.ENV_OUTPUT.code, "action": Role.ACTION.code}


@torch.no_grad()
def evaluate_role_ce(
    model, tokenizer, rows: Iterable[dict[str, Any]], *, max_completion_length: int | None = None
) -> dict[str, Any]:
    """``{"ce_env", "tokens_env", "ce_action", "tokens_action", "trajectories"}`` over ``rows`` (trajectory rows);
    ``max_completion_length`` cuts each completion at a message end, as the trainers do. A CE is ``None`` when there
    is no such token."""
    was_training = model.training
    model.eval()
    nll = {k: 0.0 for k in ROLES}
    count = {k: 0 for k in ROLES}
    n = 0
    try:
        for row in rows:
            tokens = tokenize_with_roles(tokenizer, row)
            if max_completion_length is not None:
                tokens = tokens.truncate(tokens.prompt_length + max_completion_length)
            ids = torch.tensor([tokens.input_ids], dtype=torch.long, device=model.device)
            logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            token_logps = logps.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).cpu()
            roles = torch.as_tensor(tokens.roles[1:], dtype=torch.long)  # the role of each predicted token
            for name, code in ROLES.items():
                mask = roles == code
                nll[name] += float(-token_logps[mask].sum())
                count[name] += int(mask.sum())
            n += 1
    finally:
        model.train(was_training)
    out: dict[str, Any] = {"trajectories": n}
    for name in ROLES:
        out[f"ce_{name}"] = nll[name] / count[name] if count[name] else None
        out[f"tokens_{name}"] = count[name]
    return out
