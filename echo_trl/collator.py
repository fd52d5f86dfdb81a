"""Role-aware collation: trajectory rows -> exactly the tensors TRL's GRPO loss expects, plus ECHO masks.

Offline (recorded trajectories) a row is rendered and tokenized once by
:func:`echo_trl.tokenization.tokenize_with_roles`; the ids are split at ``prompt_length`` into
TRL's ``prompt_ids`` (left-padded) and ``completion_ids`` (right-padded), and

* ``tool_mask`` = action tokens (TRL multiplies it into ``completion_mask`` for the policy loss,
  so only the agent's own tokens get policy gradient, exactly as in TRL's multi-turn tool loop);
* ``env_output_mask`` / ``warning_mask`` / ``world_mask`` = the ECHO roles;
* ``old_per_token_logps`` = the recorded ``behavior_logprobs`` at the action positions (NaN for
  rows that have none: the trainer treats those rows as on-policy).

Online, :func:`tool_content_mask` finds the tool-output *content* inside the ``tool_mask == 0``
spans TRL's tool loop produced (those spans also hold role headers and the next generation
prompt, which are not environment output).

Everything here is pure (a tokenizer and Python/torch values; no trainer, no model).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .dataset import row_to_trajectory
from .errors import DatasetSchemaError
from .roles import Trajectory
from .tokenization import ACTION, ENV_OUTPUT, WARNING, RoleTokens, tokenize_with_roles, world_codes

#: Rollout-quality statistics (percentages, 0-100) the world-term filters read. A dataset may carry
#: columns of these names to override the values derived from the messages.
QUALITY_KEYS = ("valid_tool_call_pct", "parse_clean_pct", "correct_pct")

#: Harness actions that are valid calls though no tool schema lists them (AWM's ``verify``).
HARNESS_ACTIONS = frozenset({"verify"})


@dataclass(frozen=True)
class CollatorSettings:
    world_loss_target: str = "env_only"
    max_completion_length: int | None = None  # completion tokens kept (cut at message ends)
    max_world_model_tokens: int | None = None  # per observation
    min_valid_tool_call_pct: float = 0.0
    min_parse_clean_pct: float = 0.0
    min_correct_pct: float = 0.0

    @classmethod
    def from_args(cls, args) -> CollatorSettings:
        return cls(world_loss_target=args.world_loss_target, max_completion_length=args.max_completion_length,
                   max_world_model_tokens=args.max_world_model_tokens,
                   min_valid_tool_call_pct=args.wm_filter_min_valid_tool_call_pct,
                   min_parse_clean_pct=args.wm_filter_min_parse_clean_pct,
                   min_correct_pct=args.wm_filter_min_correct_pct)


# --------------------------------------------------------------------------------------------
# Rollout quality (what the world-term filters look at)


def is_error_output(text: Any) -> bool:
    """Whether a tool message reports a failure: ``Error...`` text, or an object with a truthy ``error``.

    Covers AWM errors (``error`` observations become ``Error: ...`` text or JSON with an ``error``
    field) and TRL's tool loop, which records a failed call as ``str({"error": "..."})``.
    """
    if not isinstance(text, str):
        return False
    s = text.strip()
    if s.lower().startswith("error"):
        return True
    if s.startswith("{'error'"):
        return True
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            return False
        return isinstance(obj, dict) and bool(obj.get("error"))
    return False


def rollout_quality(messages: Sequence[dict[str, Any]], tools: Sequence[Any] = (),
                    warnings: Sequence[Sequence[str]] | None = None) -> dict[str, float]:
    """Percentages (0-100) of valid tool calls, cleanly parsed turns and non-error tool results.

    * ``valid_tool_call_pct``: assistant turns with a tool call whose every name is among ``tools``
      or :data:`HARNESS_ACTIONS` (any name counts when the tool list is unknown);
    * ``parse_clean_pct``: assistant turns that parsed into a tool call and whose tool results
      carried no harness warning;
    * ``correct_pct``: tool results that are not errors (:func:`is_error_output`).

    A trajectory with no assistant turn (or no tool result) scores 100 on that statistic.
    """
    names = {_tool_name(t) for t in tools} - {None}
    names = names | HARNESS_ACTIONS if names else names
    warnings = list(warnings) if warnings is not None else [[] for _ in messages]
    turns = valid = clean = results = ok = 0
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            turns += 1
            calls = m.get("tool_calls") or []
            called = [c.get("function", {}).get("name") for c in calls]
            if calls and (not names or all(n in names for n in called)):
                valid += 1
            answers = []
            j = i + 1
            while j < len(messages) and messages[j].get("role") == "tool":
                answers.append(j)
                j += 1
            if calls and not any(warnings[j] for j in answers if j < len(warnings)):
                clean += 1
        elif m.get("role") == "tool":
            results += 1
            ok += not is_error_output(m.get("content"))
    pct = lambda a, b: 100.0 * a / b if b else 100.0  # noqa: E731
    return {"valid_tool_call_pct": pct(valid, turns), "parse_clean_pct": pct(clean, turns),
            "correct_pct": pct(ok, results)}


def _tool_name(tool: Any) -> str | None:
    if isinstance(tool, str):
        try:
            tool = json.loads(tool)
        except ValueError:
            return tool
    if isinstance(tool, dict):
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        return fn.get("name")
    return getattr(tool, "__name__", None)


def passes_filters(quality: dict[str, float], settings: CollatorSettings) -> bool:
    """Whether a rollout's env tokens may train the world model (the filters gate only the world term)."""
    return (quality["valid_tool_call_pct"] >= settings.min_valid_tool_call_pct
            and quality["parse_clean_pct"] >= settings.min_parse_clean_pct
            and quality["correct_pct"] >= settings.min_correct_pct)


# --------------------------------------------------------------------------------------------
# Advantages from recorded rewards


def group_advantages(rewards: Sequence[float], group_ids: Sequence[str], scale_rewards: str = "group") -> np.ndarray:
    """GRPO advantages of recorded trajectories, grouped by ``group_id`` (not by position).

    Same formulas as TRL 1.16's ``sum_then_normalize``: ``reward - group mean``, divided by
    ``std + 1e-4`` where ``scale_rewards`` is ``"group"`` (Bessel-corrected std of the group) or
    ``"batch"`` (std of all given rewards), not divided for ``"none"``. A group of one gets 0.
    """
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', got {scale_rewards!r}")
    r = np.asarray(rewards, dtype=np.float64)
    out = np.zeros_like(r)
    groups: dict[str, list[int]] = {}
    for i, g in enumerate(group_ids):
        groups.setdefault(g, []).append(i)
    batch_std = float(np.std(r, ddof=1)) if len(r) > 1 else 0.0
    for idx in groups.values():
        vals = r[idx]
        if len(idx) < 2:
            continue  # advantage 0: nothing to compare with (still trains the world term)
        adv = vals - vals.mean()
        if scale_rewards == "group":
            adv = adv / (float(np.std(vals, ddof=1)) + 1e-4)
        elif scale_rewards == "batch":
            adv = adv / (batch_std + 1e-4)
        out[idx] = adv
    return out


# --------------------------------------------------------------------------------------------
# Offline: one trajectory row -> per-token features


@dataclass
class TrajectoryFeatures:
    prompt_ids: list[int]
    completion_ids: list[int]
    action_mask: list[int]
    env_output_mask: list[int]
    warning_mask: list[int]
    world_mask: list[int]  # after target, per-observation cap and filters
    behavior_logps: list[float] | None  # aligned to completion_ids (NaN off the action tokens)
    truncated_tokens: int
    quality: dict[str, float]
    passes: bool


def _role_tokens(tokenizer, trajectory: Trajectory, settings: CollatorSettings) -> tuple[RoleTokens, RoleTokens]:
    """(kept, full): the tokens cut to ``max_completion_length``, and the whole trajectory."""
    full = tokenize_with_roles(tokenizer, trajectory, world_loss_target=settings.world_loss_target)
    limit = settings.max_completion_length
    kept = full if limit is None else full.truncate(full.prompt_length + limit)
    return kept, full


def trajectory_features(tokenizer, row: dict[str, Any] | Trajectory, settings: CollatorSettings) -> TrajectoryFeatures:
    """Tokens and masks of one trajectory, split into prompt and completion."""
    trajectory = row if isinstance(row, Trajectory) else row_to_trajectory(row)
    tokens, full = _role_tokens(tokenizer, trajectory, settings)
    p = tokens.prompt_length
    roles = tokens.roles[p:]
    world = np.isin(roles, world_codes(settings.world_loss_target))
    if settings.max_world_model_tokens is not None:
        cap = settings.max_world_model_tokens
        for k, (a, b) in enumerate(tokens.message_token_spans):
            if trajectory.completion[k].get("role") == "tool":
                idx = np.flatnonzero(world[a - p:b - p]) + (a - p)
                world[idx[cap:]] = False

    quality = rollout_quality(trajectory.completion, trajectory.tools, trajectory.warnings)
    if isinstance(row, dict):
        for key in QUALITY_KEYS:
            if row.get(key) is not None:
                quality[key] = float(row[key])
    passes = passes_filters(quality, settings)
    if not passes:
        world[:] = False

    action = roles == ACTION
    behavior = None
    if trajectory.behavior_logprobs is not None:
        n_action_full = int((full.roles == ACTION).sum())
        recorded = list(trajectory.behavior_logprobs)
        if len(recorded) != n_action_full:
            raise DatasetSchemaError(
                f"trajectory {trajectory.group_id!r}: behavior_logprobs has {len(recorded)} values for "
                f"{n_action_full} action tokens under this tokenizer; record one log-prob per action token "
                "(the tokens the policy generated, end-of-turn included) with the tokenizer you train with")
        behavior = [math.nan] * len(roles)
        for pos, value in zip(np.flatnonzero(action), recorded, strict=False):
            behavior[int(pos)] = float(value)

    return TrajectoryFeatures(
        prompt_ids=list(tokens.input_ids[:p]), completion_ids=list(tokens.input_ids[p:]),
        action_mask=action.astype(np.int64).tolist(), env_output_mask=(roles == ENV_OUTPUT).astype(np.int64).tolist(),
        warning_mask=(roles == WARNING).astype(np.int64).tolist(), world_mask=world.astype(np.int64).tolist(),
        behavior_logps=behavior, truncated_tokens=tokens.truncated_tokens, quality=quality, passes=passes)


def _pad(rows: list[list], value, side: str, dtype) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            t = torch.tensor(r, dtype=dtype)
            if side == "left":
                out[i, width - len(r):] = t
            else:
                out[i, :len(r)] = t
    return out


def collate_features(features: list[TrajectoryFeatures], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Pad per-trajectory features into TRL's batch layout (prompts left-padded, completions right-padded)."""
    prompt_ids = _pad([f.prompt_ids for f in features], pad_token_id, "left", torch.long)
    prompt_mask = _pad([[1] * len(f.prompt_ids) for f in features], 0, "left", torch.long)
    completion_ids = _pad([f.completion_ids for f in features], pad_token_id, "right", torch.long)
    completion_mask = _pad([[1] * len(f.completion_ids) for f in features], 0, "right", torch.long)
    batch = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "tool_mask": _pad([f.action_mask for f in features], 0, "right", torch.long),
        "env_output_mask": _pad([f.env_output_mask for f in features], 0, "right", torch.long),
        "warning_mask": _pad([f.warning_mask for f in features], 0, "right", torch.long),
        "world_mask": _pad([f.world_mask for f in features], 0, "right", torch.long),
    }
    if any(f.behavior_logps is not None for f in features):
        rows = [f.behavior_logps if f.behavior_logps is not None else [math.nan] * len(f.completion_ids)
                for f in features]
        batch["old_per_token_logps"] = _pad(rows, math.nan, "right", torch.float32)
    return batch


# --------------------------------------------------------------------------------------------
# Online: tool-output content inside TRL's tool_mask == 0 spans

_PROBE = "ECHOPROBE{}Z"


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
    starts = [len(tokenizer.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False))
              for k in range(len(ids))]
    return text, starts


def _content_ranges(text: str, probe_text: str, contents: list[str]) -> list[tuple[int, int]] | None:
    """Char ranges of ``contents`` in ``text``, aligning the template pieces of ``probe_text`` from the right."""
    pieces = []  # static template text between probes: seg_0, ..., seg_K
    rest = probe_text
    for k in range(len(contents)):
        probe = _PROBE.format(k)
        if rest.count(probe) != 1:
            return None
        before, rest = rest.split(probe)
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


def tool_content_mask(
    tokenizer,
    completion_ids: Sequence[int],
    tool_mask: Sequence[int],
    completion_messages: Sequence[dict[str, Any]],
    render_suffix: Callable[[list[dict[str, Any]]], str],
) -> list[int] | None:
    """1 on the tokens of tool-output content inside the ``tool_mask == 0`` spans, 0 elsewhere.

    ``render_suffix(tool_messages)`` renders the text TRL tokenized for a span (the tool messages
    and the next generation prompt, after the template scaffolding that precedes them); it is
    called with probe contents to learn where the template puts each message's content. A token
    is env output when its first character lies in a content range (as in ``tokenize_with_roles``).
    Returns ``None`` when a span cannot be aligned (the caller counts it and trains nothing there).
    """
    mask = [0] * len(completion_ids)
    spans = zero_spans(tool_mask)
    groups = tool_message_groups(completion_messages)
    if len(spans) != len(groups):
        return None
    for (a, b), group in zip(spans, groups, strict=True):
        contents = [m.get("content") for m in group]
        if not all(isinstance(c, str) for c in contents):
            continue  # multimodal tool output: no text to learn
        text, starts = token_char_starts(tokenizer, completion_ids[a:b])
        probed = [{**m, "content": _PROBE.format(k)} for k, m in enumerate(group)]
        ranges = _content_ranges(text, render_suffix(probed), contents)
        if ranges is None:
            return None
        bounds = np.asarray(starts)
        for lo, hi in ranges:
            for j in np.flatnonzero((bounds >= lo) & (bounds < hi)):
                mask[a + int(j)] = 1
    return mask
