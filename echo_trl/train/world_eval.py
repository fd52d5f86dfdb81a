"""Held-out cross-entropy per role: env-output tokens (the paper's world-model metric, its Fig. 3), warnings, and
the agent's own action tokens (the policy).

Teacher-forced, in nats per token, at temperature 1 (true cross-entropy), token-weighted over all rows: how well
the model predicts what the environment answered, and what the agent did, given everything before it. One
evaluator for every caller: ``echo-trl eval-world-model``, the two-stage comparison (SFT, then ECHO-GRPO: what
each stage moves), and inside ``EchoGRPOTrainer.evaluate`` (:class:`HeldOutTotals`, the same sums from the
trainer's own forward). :func:`evaluate_world_model` is independent of TRL and of both trainers (a plain
``model(...)`` forward, the model's own LM head, on the exact tokens of
:func:`~echo_trl.tokens.tokenization.tokenize_with_roles`), so it also serves as the reference the trainers'
metrics are checked against.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..errors import EchoTrlError
from ..progress import progress
from ..roles import Role
from ..tokens.cache import has_tokens, row_tokens
from ..tokens.tokenization import tokenize_with_roles
from .batch import CompletionMasks
from .step.loss import WorldTotals, masked_nll

__all__ = ["evaluate_world_model", "trajectory_env_nll"]

#: The roles evaluated, by the name their keys carry (``env_nll``, ``ce_env`` ...).
ROLES = {"env": Role.ENV_OUTPUT.code, "warning": Role.WARNING.code, "action": Role.ACTION.code}


@torch.no_grad()
def trajectory_env_nll(
    model,
    tokenizer,
    row: dict[str, Any],
    *,
    max_length: int | None = None,
    max_completion_length: int | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """Summed negative log-likelihood and count of one trajectory's tokens of each of :data:`ROLES`:
    ``{"env_nll", "env_tokens", "warning_nll", "warning_tokens", "action_nll", "action_tokens"}``.

    ``max_length`` cuts the whole trajectory, ``max_completion_length`` its completion, as the trainer
    does (both at a message end).
    """
    # once (the token cache's, when the row carries them); the cuts below reuse these tokens
    tokens = row_tokens(row) if has_tokens(row) else tokenize_with_roles(tokenizer, row)
    if max_completion_length is not None:
        tokens = tokens.truncate(tokens.prompt_length + max_completion_length)
    if max_length is not None:
        tokens = tokens.truncate(max_length)
    ids = torch.tensor([tokens.input_ids], dtype=torch.long, device=device or model.device)
    roles = torch.as_tensor(tokens.roles, dtype=torch.long)
    out: dict[str, float] = {k: v for name in ROLES for k, v in ((f"{name}_nll", 0.0), (f"{name}_tokens", 0))}
    targets = torch.isin(roles, torch.tensor(list(ROLES.values()))).nonzero().flatten()
    targets = targets[targets > 0]  # the first token has no context to be predicted from
    if targets.numel() == 0:
        return out
    # Only the logits that predict the evaluated tokens (position t-1 predicts token t): memory stays
    # proportional to those tokens, whatever the vocabulary and sequence length.
    positions = (targets - 1).to(ids.device)
    logits = model(input_ids=ids, logits_to_keep=positions).logits[0].float()
    logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, targets.to(ids.device)].unsqueeze(-1)).squeeze(-1)
    nll = (-logps).cpu()
    for name, code in ROLES.items():
        mask = roles[targets] == code
        out[f"{name}_nll"], out[f"{name}_tokens"] = float(nll[mask].sum()), int(mask.sum())
    return out


def evaluate_world_model(
    model,
    tokenizer,
    rows: Iterable[dict[str, Any]],
    *,
    max_length: int | None = None,
    max_completion_length: int | None = None,
    show_progress: bool | None = None,
) -> dict[str, Any]:
    """Token-weighted held-out CE over ``rows`` (trajectory rows): per role overall, and env CE per scenario.

    Returns ``{"ce_env", "tokens_env", "by_scenario": {scenario: {"ce_env", "tokens_env", "trajectories"}},
    "trajectories", "ce_warning", "tokens_warning", "ce_action", "tokens_action"}`` (a CE is ``None`` when there
    are no such tokens).
    """
    was_training = model.training
    model.eval()
    totals: dict[str, float] = defaultdict(float)
    scen: dict[str, dict[str, float]] = defaultdict(lambda: {"env_nll": 0.0, "env_tokens": 0, "trajectories": 0})
    n = 0
    try:
        rows = rows if hasattr(rows, "__len__") else list(rows)  # a dataset is read a row at a time
        for index, row in enumerate(progress(rows, desc="eval env CE", unit="traj", enable=show_progress)):
            try:
                r = trajectory_env_nll(
                    model, tokenizer, row, max_length=max_length, max_completion_length=max_completion_length
                )
            except EchoTrlError as exc:  # a row that cannot be rendered or is over the size bound: name it
                raise type(exc)(f"row {index} (group_id {row.get('group_id')!r}): {exc}") from None
            for k, v in r.items():
                totals[k] += v
            s = scen[row.get("scenario") or ""]
            s["env_nll"] += r["env_nll"]
            s["env_tokens"] += r["env_tokens"]
            s["trajectories"] += 1
            n += 1
    finally:
        model.train(was_training)
    ce = lambda nll, k: (nll / k) if k else None  # noqa: E731
    per_role = {}
    for name in ROLES:
        per_role[f"ce_{name}"] = ce(totals[f"{name}_nll"], totals[f"{name}_tokens"])
        per_role[f"tokens_{name}"] = int(totals[f"{name}_tokens"])
    return {
        "ce_env": per_role.pop("ce_env"),
        "tokens_env": per_role.pop("tokens_env"),
        "by_scenario": {
            name: {
                "ce_env": ce(v["env_nll"], v["env_tokens"]),
                "tokens_env": int(v["env_tokens"]),
                "trajectories": int(v["trajectories"]),
            }
            for name, v in sorted(scen.items())
        },
        "trajectories": n,
        **per_role,
    }


class HeldOutTotals:
    """The trainer's ``eval_world/ce_env`` and ``eval_world/ce_warning``: token-weighted over a whole
    evaluation (not a mean of batch means), each recorded trajectory counted once.

    With several processes accelerate evens out the last eval batch by repeating rows from the start
    of the eval set; their per-row sums are gathered with their row index and repeats are skipped.
    Without an index (generated completions: every one is a new sample) the all-reduced sums are added.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.env_nll = self.env_tokens = self.warning_nll = self.warning_tokens = 0.0
        self.seen: set[int] = set()  # row indices already in the sums

    def add(
        self,
        index: torch.Tensor | None,
        logps: torch.Tensor,
        masks: CompletionMasks,
        batch: WorldTotals,
        gather: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        """Add one micro-batch; ``batch`` holds its all-reduced sums, ``gather`` is accelerate's."""
        if index is None:
            self._add(batch.env_nll, batch.env_tokens, batch.warning_nll, batch.warning_tokens)
            return
        logps = logps.detach()
        per_row = torch.stack(
            [
                masked_nll(logps, masks.env_output).sum(1),
                masks.env_output.sum(1).float(),
                masked_nll(logps, masks.warning).sum(1),
                masks.warning.sum(1).float(),
            ],
            1,
        )
        for i, (env_nll, env_tokens, warning_nll, warning_tokens) in zip(
            gather(index).tolist(), gather(per_row).tolist(), strict=True
        ):
            if i not in self.seen:
                self.seen.add(i)
                self._add(env_nll, env_tokens, warning_nll, warning_tokens)

    def _add(self, env_nll: float, env_tokens: float, warning_nll: float, warning_tokens: float) -> None:
        self.env_nll += env_nll
        self.env_tokens += env_tokens
        self.warning_nll += warning_nll
        self.warning_tokens += warning_tokens

    def means(self) -> dict[str, float]:
        """``{"world/ce_env": ..., "world/ce_warning": ...}`` for the kinds of tokens seen so far."""
        out = {}
        if self.env_tokens > 0:
            out["world/ce_env"] = self.env_nll / self.env_tokens
        if self.warning_tokens > 0:
            out["world/ce_warning"] = self.warning_nll / self.warning_tokens
        return out
