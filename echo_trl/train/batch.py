"""A batch in TRL's GRPO layout plus ECHO's masks: what its forwards take and which tokens the world term reads.

TRL's batch holds the left-padded ``prompt_ids`` / ``prompt_mask`` and the right-padded ``completion_ids`` /
``completion_mask``, with ``tool_mask`` (1 = the model's own token) where a tool loop ran; ECHO adds
``env_output_mask``, ``warning_mask`` and ``world_mask`` over the completion (offline from
:mod:`echo_trl.train.collator`, online from :mod:`echo_trl.train.online_masks`). Pure: torch values only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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
