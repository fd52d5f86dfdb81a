"""Online mode: ECHO's masks for completions TRL generated (its tool loop, or a ``rollout_func``).

TRL's tool loop marks the tokens it appended after each tool call with ``tool_mask == 0``; those
spans hold the tool output *content* but also role headers, ``<tool_response>`` tags and the next
generation prompt, which are not environment output. :func:`tool_span_roles` locates the content
inside each span, and the generation prompt (context, as offline: no world target includes it);
:func:`online_masks` turns everything into per-token role codes and calls the same
:func:`echo_trl.tokens.world_mask.world_mask` as offline collation. Pure: a tokenizer, Python and torch values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..roles import Role
from ..tokens.layout import probe_format
from ..tokens.quality import passes_filters, rollout_quality
from ..tokens.world_mask import world_mask
from . import metrics, trl_compat
from .batch import GeneratedRollouts
from .loss import global_count


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


def zero_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` runs of zeros in ``mask``."""
    spans, start = [], None
    for i, v in enumerate(list(mask) + [1]):
        if v == 0 and start is None:
            start = i
        elif v != 0 and start is not None:
            spans.append((start, i))
            start = None
    return spans


def tool_message_groups(messages: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive runs of ``tool`` messages (one run per tool-loop iteration of TRL)."""
    groups, current = [], []
    for m in messages:
        if m.get("role") == "tool":
            current.append(m)
        elif current:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def token_char_starts(tokenizer, ids: Sequence[int]) -> tuple[str, list[int]]:
    """The decoded text of ``ids`` and the character where each token starts."""
    ids = list(ids)
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == ids:
            return text, [int(a) for a, _ in enc["offset_mapping"]]
    except (NotImplementedError, ValueError, TypeError):  # slow tokenizers have no offsets
        pass
    starts = [
        len(tokenizer.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        for k in range(len(ids))
    ]
    return text, starts


def _content_ranges(text: str, probe_text: str, probe: str, contents: list[str]) -> list[tuple[int, int]] | None:
    """Char ranges of ``contents`` in ``text``, aligning the template pieces of ``probe_text`` from the right."""
    pieces = []  # static template text between probes: seg_0, ..., seg_K
    rest = probe_text
    for k in range(len(contents)):
        probe_k = probe.format(k)
        if rest.count(probe_k) != 1:
            return None
        before, rest = rest.split(probe_k)
        pieces.append(before)
    pieces.append(rest)
    end = len(text)
    ranges: list[tuple[int, int]] = []
    for k in range(len(contents), 0, -1):
        seg = pieces[k]
        if not text[:end].endswith(seg):
            return None
        end -= len(seg)
        content = contents[k - 1]
        for form in (content, json.dumps(content, ensure_ascii=False)[1:-1]):
            if text[:end].endswith(form):
                ranges.append((end - len(form), end))
                end -= len(form)
                break
        else:
            return None
    if not pieces[0].endswith(text[:end]):
        return None  # the span should begin inside the template text before the first tool message
    return ranges[::-1]


def tool_span_roles(
    tokenizer,
    completion_ids: Sequence[int],
    tool_mask: Sequence[int],
    completion_messages: Sequence[dict[str, Any]],
    render_suffix: Callable[..., str],
) -> list[int] | None:
    """Role code of each token: action where ``tool_mask == 1``; inside each ``tool_mask == 0`` span env output
    (tool-output content), context (the next generation prompt) or observation (the template's wrapper).

    ``render_suffix(tool_messages, add_generation_prompt=True)`` renders the text TRL tokenized for a
    span (the tool messages and the next generation prompt, after the template scaffolding that precedes
    them); it is called with probe contents to learn where the template puts each message's content, and
    once more without the generation prompt: TRL appends the assistant header of the next turn to the tool
    suffix, while offline collation (``layout.py``) leaves that header context, so online it is context too.
    A token's role is the role of its first character (as in ``tokenize_with_roles``).
    Returns ``None`` when a span cannot be aligned (the caller counts it and trains nothing there).
    """
    roles = [Role.ACTION.code if v else Role.OBSERVATION.code for v in tool_mask][: len(completion_ids)]
    spans = zero_spans(tool_mask)
    groups = tool_message_groups(completion_messages)
    if len(spans) != len(groups):
        return None
    for (a, b), group in zip(spans, groups, strict=True):
        contents = [m.get("content") for m in group]
        text, starts = token_char_starts(tokenizer, completion_ids[a:b])
        bounds = np.asarray(starts)
        probe = probe_format(text, *(c for c in contents if isinstance(c, str)))
        probed = [{**m, "content": probe.format(k)} for k, m in enumerate(group)]
        with_prompt = render_suffix(probed)
        without = render_suffix(probed, add_generation_prompt=False)
        prompt_len = len(with_prompt) - len(without) if with_prompt.startswith(without) else 0
        if prompt_len and text.endswith(with_prompt[-prompt_len:]):
            for j in np.flatnonzero(bounds >= len(text) - prompt_len):
                roles[a + int(j)] = Role.CONTEXT.code
        if not all(isinstance(c, str) for c in contents):
            continue  # multimodal tool output: no text to learn
        ranges = _content_ranges(text, with_prompt, probe, contents)
        if ranges is None:
            return None
        for lo, hi in ranges:
            for j in np.flatnonzero((bounds >= lo) & (bounds < hi)):
                roles[a + int(j)] = Role.ENV_OUTPUT.code
    return roles


def tool_content_mask(
    tokenizer,
    completion_ids: Sequence[int],
    tool_mask: Sequence[int],
    completion_messages: Sequence[dict[str, Any]],
    render_suffix: Callable[..., str],
) -> list[int] | None:
    """1 on the tokens of tool-output content inside the ``tool_mask == 0`` spans (see :func:`tool_span_roles`)."""
    roles = tool_span_roles(tokenizer, completion_ids, tool_mask, completion_messages, render_suffix)
    return None if roles is None else [int(r == Role.ENV_OUTPUT.code) for r in roles]


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
    (:func:`tool_content_mask`); else every ``env_mask == 0`` token of a rollout_func. ``settings`` is a
    :class:`echo_trl.train.collator.CollatorSettings` (world target, per-observation cap, filters).
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
    metrics they log (as :func:`echo_trl.train.offline.collate_batch` does for a recorded batch); returns what the
    user should hear about them (once per run), by key."""
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
