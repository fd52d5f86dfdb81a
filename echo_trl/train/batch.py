"""A batch in TRL's GRPO layout plus ECHO's masks: what its forwards take and which tokens the world term reads.

TRL's batch holds the left-padded ``prompt_ids`` / ``prompt_mask`` and the right-padded ``completion_ids`` /
``completion_mask``, with ``tool_mask`` (1 = the model's own token) where a tool loop ran; ECHO adds
``env_output_mask``, ``warning_mask`` and ``world_mask`` over the completion (offline from
:mod:`echo_trl.train.offline.collator`, online from :mod:`echo_trl.train.online.masks`). Pure: torch values only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .model import logps_from_hidden


def forward_inputs(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(input_ids, attention_mask, logits_to_keep)`` of a batch, as TRL's forwards take them: the prompt and
    the completion side by side, log-probs for the completion columns."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return input_ids, attention_mask, batch["completion_ids"].size(1)


@dataclass(frozen=True)
class CompletionMasks:
    """Boolean masks over a batch's completion tokens (padding excluded); a mask the batch lacks is all False."""

    world: torch.Tensor  # the tokens the world term trains on
    env_output: torch.Tensor
    warning: torch.Tensor
    action: torch.Tensor  # the model's own tokens (the policy term's)

    @classmethod
    def of(cls, batch: dict[str, Any]) -> CompletionMasks:
        completion = batch["completion_mask"].bool()
        zeros = torch.zeros_like(completion)
        return cls(
            world=batch.get("world_mask", zeros).bool() & completion,
            env_output=batch.get("env_output_mask", zeros).bool() & completion,
            warning=batch.get("warning_mask", zeros).bool() & completion,
            action=completion & (batch["tool_mask"].bool() if "tool_mask" in batch else True),
        )

    @property
    def scored(self) -> torch.Tensor:
        """The tokens whose log-probs the world term or its metrics read."""
        return self.world | self.env_output | self.warning


@dataclass
class GeneratedRollouts:
    """What TRL's ``_generate`` returned that the masks need (unpadded, one entry per completion)."""

    completion_ids: list[list[int]]
    tool_mask: list[list[int]] | None  # TRL's tool loop / a rollout_func's env_mask: 1 = model token
    completions: list[Any]  # the completion messages (a list) or text
    extra_fields: dict[str, Any]  # a rollout_func's extra fields (``env_output_mask``, ``warning_mask``)


@dataclass
class LossForward:
    """The loss forward of one ``_compute_loss``: set up by the trainer before TRL's loss runs, filled by its
    ``_get_per_token_logps_and_entropies`` override at the first call inside it (the one forward TRL 1.16's
    ``_compute_loss`` runs), and read by the world term, which reuses its log-probs (no second forward)."""

    inputs: dict[str, Any]  # the micro-batch TRL's loss reads (a copy: its old log-probs may be filled in)
    wants_hidden: bool = False  # also record the backbone's last hidden states (the world term re-projects them)
    logps: torch.Tensor | None = None  # per completion token, with grad
    hidden: torch.Tensor | None = None
    tokens_run: int | None = None  # tokens the shared-prefix forward ran; None: TRL's padded forward (every column)

    def logps_at(self, temperature: float, policy_temperature: float, model, scored: torch.Tensor) -> torch.Tensor:
        """Per completion token log-probs at ``temperature``: TRL's own where it is TRL's (the policy's)
        temperature, else the recorded hidden states re-projected at ``temperature`` (over ``scored``)."""
        if math.isclose(temperature, policy_temperature):
            return self.logps
        return logps_from_hidden(model, self.hidden, self.inputs["completion_ids"], scored, temperature)

    def token_use(self, trained: torch.Tensor) -> tuple[int, int, int]:
        """``(own, run, trained)`` token counts of this forward: the rows' own (unpadded) tokens, the tokens run
        through the model, and those of them ``trained`` marks (over the completion)."""
        input_ids, attention_mask, _ = forward_inputs(self.inputs)
        run = input_ids.numel() if self.tokens_run is None else self.tokens_run
        return int(attention_mask.sum()), run, int(trained.sum())


def fill_unrecorded_old_logps(inputs: dict[str, Any], logps: torch.Tensor) -> None:
    """Where ``inputs["old_per_token_logps"]`` is NaN (rows recorded without behaviour log-probs, with no
    starting-model ones either: ``behavior_policy="current"``), put ``logps`` detached: importance ratio 1, as
    TRL does for a whole on-policy batch. ``inputs`` is changed in place (pass a copy of TRL's batch)."""
    old = inputs.get("old_per_token_logps")
    if old is not None and torch.isnan(old).any():
        inputs["old_per_token_logps"] = torch.where(torch.isnan(old), logps.detach(), old)
