"""Online mode: ECHO's masks for completions TRL generated (its tool loop, or a ``rollout_func``).

TRL's tool loop marks the tokens it appended after each tool call with ``tool_mask == 0``; those
spans hold the tool output *content* but also role headers, ``<tool_response>`` tags and the next
generation prompt, which are not environment output. :func:`echo_trl.tokens.template.tool_content.tool_span_roles`
locates the content inside each span (as offline layouts locate it in a whole conversation), and the generation
prompt (context, as offline: no world target includes it); :func:`online_masks` turns everything into per-token
role codes and calls the same :func:`echo_trl.tokens.world_mask.world_mask` as offline collation (pure: a
tokenizer, Python and torch values); :func:`add_online_masks` adds them to TRL's generated batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...roles import Role
from ...tokens.quality import passes_filters, rollout_quality
from ...tokens.template.tool_content import tool_span_roles
from ...tokens.world_mask import world_mask
from .. import trl_compat
from ..batch import GeneratedRollouts
from ..step import metrics
from ..step.loss import global_count


@dataclass
class OnlineMasks:
    env_output_mask: torch.Tensor
    warning_mask: torch.Tensor
    world_mask: torch.Tensor
    passes: torch.Tensor  # per completion: the world-term filters' verdict
    align_failures: int  # completions whose tool-output content could not be located (no world term)
    env_mask_fallback: bool  # a rollout_func gave env_mask only: every env_mask == 0 token counted as env output

    def columns(self) -> dict[str, torch.Tensor]:
        """The masks as the batch columns ECHO adds to TRL's generated batch."""
        return {
            "env_output_mask": self.env_output_mask,
            "warning_mask": self.warning_mask,
            "world_mask": self.world_mask,
        }

    def warnings(self) -> dict[str, str]:
        """What the user should hear about these masks (once per run), by key."""
        found = {}
        if self.env_mask_fallback:
            found["rollout_env_mask"] = (
                "rollout_func returned env_mask but no env_output_mask: every env_mask == 0 token counts as "
                "environment output (template scaffolding included). Return env_output_mask for content-only "
                "world-model targets."
            )
        if self.align_failures:
            found["align"] = (
                "could not locate tool-output content in some tool_mask == 0 spans; those completions train no "
                "world term (see world/online_align_failures)"
            )
        return found


def online_masks(
    rollouts: GeneratedRollouts | None,
    completion_mask: torch.Tensor,
    tool_mask: torch.Tensor | None,
    *,
    tokenizer,
    tools: Sequence[Any] | None,
    settings,
    render_suffix: Callable[..., str],
) -> OnlineMasks:
    """Env-output / warning / world masks of a generated batch (padded like ``completion_mask``).

    Env output per completion, in order of preference: the ``env_output_mask`` a rollout_func returned
    (with its ``warning_mask``); the tool-output content in TRL's tool-loop spans
    (:func:`~echo_trl.tokens.template.tool_content.tool_span_roles`); else every ``env_mask == 0`` token of a
    rollout_func. ``settings`` is a :class:`echo_trl.train.offline.collator.CollatorSettings` (world target,
    per-observation cap, filters).
    """
    shape, device = completion_mask.shape, completion_mask.device
    env = np.zeros(shape, dtype=np.int64)
    warn = np.zeros(shape, dtype=np.int64)
    prompt = np.zeros(shape, dtype=bool)  # TRL's next generation prompt inside a tool-loop span: context
    passes = np.ones(shape[0], dtype=bool)
    failures, fallback = 0, False
    if rollouts is not None:
        extra, masks = rollouts.extra_fields or {}, rollouts.tool_mask
        for i, ids in enumerate(rollouts.completion_ids):
            messages = rollouts.completions[i]
            row_env = None
            if "env_output_mask" in extra:
                row_env = list(extra["env_output_mask"][i])
                if "warning_mask" in extra:
                    warn[i, : len(ids)] = list(extra["warning_mask"][i])[: len(ids)]
            elif tools and masks is not None and isinstance(messages, list):
                span_roles = tool_span_roles(tokenizer, ids, masks[i], messages, render_suffix)
                failures += span_roles is None
                if span_roles is not None:
                    row_env = [int(r == Role.ENV_OUTPUT.code) for r in span_roles]
                    prompt[i, : len(span_roles)] = np.asarray(span_roles[: len(ids)]) == Role.CONTEXT.code
            elif masks is not None:
                fallback = True
                row_env = [1 - int(v) for v in masks[i]]
            if row_env is not None:
                env[i, : len(ids)] = row_env[: len(ids)]
            if isinstance(messages, list):
                passes[i] = passes_filters(rollout_quality(messages, tools or []), settings)
    completion = completion_mask.cpu().numpy().astype(bool)
    env = env.astype(bool) & completion
    warn = warn.astype(bool) & completion & ~env
    roles = np.full(shape, Role.CONTEXT.code, dtype=np.int8)
    if tool_mask is None:
        roles[completion] = Role.ACTION.code
    else:
        action = tool_mask.cpu().numpy().astype(bool)
        roles[completion & action] = Role.ACTION.code
        roles[completion & ~action & ~prompt] = Role.OBSERVATION.code
    roles[warn] = Role.WARNING.code
    roles[env] = Role.ENV_OUTPUT.code
    world = world_mask(roles, settings.world_loss_target, max_tokens=settings.max_world_model_tokens, passes=passes)

    def tensor(a):
        return torch.as_tensor(a, dtype=torch.long, device=device)

    return OnlineMasks(
        tensor(env), tensor(warn), tensor(world), torch.as_tensor(passes, device=device), failures, fallback
    )


def add_online_masks(trainer, output: dict[str, Any], rollouts: GeneratedRollouts | None, settings) -> dict[str, str]:
    """ECHO's masks and the world term's global count added to TRL's generated batch ``output`` (in place), and the
    metrics they log (as :func:`echo_trl.train.offline.recorded.collate_batch` does for a recorded batch);
    returns what the user should hear about them (once per run), by key."""
    masks = online_masks(
        rollouts,
        output["completion_mask"],
        output.get("tool_mask"),
        tokenizer=trl_compat.tokenizer(trainer),
        tools=trainer.tools,
        settings=settings,
        render_suffix=lambda msgs, **kw: trl_compat.render_tool_suffix(trainer, msgs, **kw),
    )
    gather = trainer.accelerator.gather
    world_count = global_count(masks.world_mask, trainer.args.world_loss_normalization)
    output.update(masks.columns(), world_num_items=gather(world_count).sum())
    mode = "train" if trainer.model.training else "eval"
    metrics.log_online_batch(trl_compat.metrics(trainer, mode), masks.passes, masks.align_failures, gather)
    return masks.warnings()
