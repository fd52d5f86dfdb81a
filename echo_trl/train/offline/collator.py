"""Offline collation: recorded trajectory rows -> exactly the tensors TRL's GRPO loss expects, plus ECHO masks.

A row's tokens come from its cached columns (:mod:`echo_trl.tokens.cache`, tokenized once per dataset and
tokenizer) or, for a row without them, from :func:`echo_trl.tokens.tokenization.tokenize_with_roles`; the ids
are split at ``prompt_length`` into TRL's ``prompt_ids`` (left-padded) and ``completion_ids``
(right-padded), and

* ``tool_mask`` = action tokens (TRL multiplies it into ``completion_mask`` for the policy loss,
  so only the agent's own tokens get policy gradient, exactly as in TRL's multi-turn tool loop);
* ``env_output_mask`` / ``warning_mask`` = the ECHO roles,
  ``world_mask`` = :func:`echo_trl.tokens.world_mask.world_mask`;
* ``old_per_token_logps`` = the recorded ``behavior_logprobs`` at the action positions, else the
  starting model's (:data:`STARTING_LOGPS`, ``behavior_policy="initial"``: :mod:`echo_trl.train.offline.behavior`),
  else NaN (``"current"``: the trainer fills in the policy's own, importance ratio 1).

Everything here is pure (a tokenizer and Python/torch values; no trainer, no model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...data.readers.fields import (
    BEHAVIOR_LOGPROB_FLOOR,
    BEHAVIOR_LOGPROB_RANGE,
    BEHAVIOR_LOGPROB_TOLERANCE,
    logprob_problem,
)
from ...data.schema import row_to_trajectory
from ...errors import DatasetSchemaError, EchoTrlError
from ...roles import Role, Trajectory, default_group_id
from ...tokens.cache import has_tokens, row_quality, row_tokens
from ...tokens.quality import passes_filters, rollout_quality, with_dataset_columns
from ...tokens.tokenization import TruncationError, tokenize_with_roles
from ...tokens.world_mask import world_mask

#: The starting model's log-probs at a row's kept action tokens (added by :mod:`echo_trl.train.offline.behavior`); the
#: column keeps the name of the config value (``behavior_policy="initial"``) it had from the first release.
STARTING_LOGPS = "echo_initial_logprobs"
#: Row number of each train trajectory (added at trainer init): how errors and warnings name a batch's rows, and how
#: a column computed after the dataloader was built is found (:mod:`echo_trl.train.offline.behavior`).
TRAIN_INDEX = "echo_train_index"


@dataclass(frozen=True)
class CollatorSettings:
    """The ECHO settings that shape a batch's masks (read from an ``EchoGRPOConfig``)."""

    world_loss_target: str = "env_only"
    max_completion_length: int | None = None  # completion tokens kept (cut at message ends)
    max_length: int | None = None  # prompt + completion tokens kept: the model's context length
    max_world_model_tokens: int | None = None  # per observation (see echo_trl.tokens.world_mask)
    min_valid_tool_call_pct: float = 0.0
    min_parse_clean_pct: float = 0.0
    min_correct_pct: float = 0.0

    @classmethod
    def from_args(cls, args, context_length: int | None = None) -> CollatorSettings:
        return cls(
            world_loss_target=args.world_loss_target,
            max_completion_length=args.max_completion_length,
            max_length=context_length,
            max_world_model_tokens=args.max_world_model_tokens,
            min_valid_tool_call_pct=args.wm_filter_min_valid_tool_call_pct,
            min_parse_clean_pct=args.wm_filter_min_parse_clean_pct,
            min_correct_pct=args.wm_filter_min_correct_pct,
        )


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


def trajectory_features(tokenizer, row: dict[str, Any] | Trajectory, settings: CollatorSettings) -> TrajectoryFeatures:
    """Tokens and masks of one trajectory, split into prompt and completion."""
    if isinstance(row, dict) and has_tokens(row):  # tokenized once (echo_trl.tokens.cache): no rendering, no decoding
        full, quality = row_tokens(row), row_quality(row)
        where, recorded = _where(row), row.get("behavior_logprobs")
    else:
        trajectory = row if isinstance(row, Trajectory) else row_to_trajectory(row)
        full = tokenize_with_roles(tokenizer, trajectory, world_loss_target=settings.world_loss_target)
        quality = rollout_quality(trajectory.completion, trajectory.tools, trajectory.warnings)
        quality = with_dataset_columns(quality, row) if isinstance(row, dict) else quality
        where = _where(row if isinstance(row, dict) else None, trajectory.group_id)
        recorded = trajectory.behavior_logprobs
    limit = settings.max_completion_length
    ends = [n for n in (None if limit is None else full.prompt_length + limit, settings.max_length) if n is not None]
    try:
        tokens = full.truncate(min(ends)) if ends else full
    except TruncationError as exc:  # an AWM-1K tool list can outgrow the context: name the row and the ways out
        scenario = row.get("scenario") if isinstance(row, dict) else row.scenario
        raise TruncationError(  # max_length is the model's context length here (train has no --max_length)
            f"{where} (scenario {scenario!r}): {exc} (the model's context length): rebuild the dataset with "
            "`echo-trl build-dataset --compact_tools` (tool schemas shortened), or train a model with a longer context"
        ) from None
    p = tokens.prompt_length
    roles = tokens.roles[p:]
    passes = passes_filters(quality, settings)
    world = world_mask(roles, settings.world_loss_target, max_tokens=settings.max_world_model_tokens, passes=passes)
    action = roles == Role.ACTION.code
    return TrajectoryFeatures(
        prompt_ids=list(tokens.input_ids[:p]),
        completion_ids=list(tokens.input_ids[p:]),
        action_mask=action.astype(np.int64).tolist(),
        env_output_mask=(roles == Role.ENV_OUTPUT.code).astype(np.int64).tolist(),
        warning_mask=(roles == Role.WARNING.code).astype(np.int64).tolist(),
        world_mask=world.astype(np.int64).tolist(),
        behavior_logps=_behavior_logps(
            where,
            recorded,
            action,
            int((full.roles == Role.ACTION.code).sum()),
            row.get(STARTING_LOGPS) if isinstance(row, dict) else None,
        ),
        truncated_tokens=tokens.truncated_tokens,
        quality=quality,
        passes=passes,
    )


def _where(row: dict[str, Any] | None, group_id: str | None = None) -> str:
    """How errors name a row: its number in the train dataset when it has one (:data:`TRAIN_INDEX`), else its
    group, as :func:`~echo_trl.data.schema.row_to_trajectory` reads it."""
    if row is not None and row.get(TRAIN_INDEX) is not None:
        return f"train_dataset row {row[TRAIN_INDEX]} (group_id {row.get('group_id')!r})"
    if group_id is None:
        task = row.get("task_idx")
        group_id = row.get("group_id") or default_group_id(
            row.get("scenario") or "", -1 if task is None else int(task)
        )
    return f"trajectory {group_id!r}"


def _behavior_logps(
    where: str, recorded: list[float] | None, action: np.ndarray, n_action_full: int, starting: list[float] | None
) -> list[float] | None:
    """The behaviour log-probs at the (kept) action positions, NaN elsewhere: the recorded ones (one per
    action token of the whole trajectory), else the starting model's (one per *kept* action token).

    Checked here, where they enter the loss, whatever path the row took (a dataset passed in Python is not
    loaded through :func:`~echo_trl.data.store.check_rows`): NaN marks "not recorded" in the batch (the trainer
    fills in the policy's own: ratio 1), so a recorded NaN, an infinite value or one outside the accepted range
    (:func:`~echo_trl.data.readers.fields.logprob_problem`) is refused, never trained on."""
    if recorded is None:
        if starting is None:
            return None
        if len(starting) != int(action.sum()):
            raise DatasetSchemaError(
                f"{where}: {STARTING_LOGPS} has {len(starting)} values for "
                f"{int(action.sum())} kept action tokens (computed under other truncation settings); drop the "
                "column and the trainer computes its own"
            )
        values = starting
        bad = next((i for i, v in enumerate(values) if v is None or not math.isfinite(v)), None)
        if bad is not None:
            raise EchoTrlError(
                f"{where}: {STARTING_LOGPS}[{bad}]: the starting model's log-prob is {values[bad]} (its forward "
                "overflowed: fp16? train in bf16 or float32, or set behavior_policy='current')"
            )
    else:
        values = list(recorded)
        if len(values) != n_action_full:
            raise DatasetSchemaError(
                f"{where}: behavior_logprobs has {len(values)} values for "
                f"{n_action_full} action tokens under this tokenizer; record one log-prob per action token "
                "(the tokens the policy generated, end-of-turn included) with the tokenizer you train with"
            )
        array = np.asarray(values, dtype=np.float64)  # a null becomes NaN: refused as one
        bad = np.isnan(array) | (array < BEHAVIOR_LOGPROB_FLOOR) | (array > BEHAVIOR_LOGPROB_TOLERANCE)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DatasetSchemaError(
                f"{where}: behavior_logprobs[{i}]: {logprob_problem(float(array[i]))}; {BEHAVIOR_LOGPROB_RANGE}"
            )
    behavior = [math.nan] * len(action)
    for pos, value in zip(np.flatnonzero(action), values, strict=False):
        behavior[int(pos)] = float(value)
    return behavior


def _pad(rows: list[list], value, side: str, dtype) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            t = torch.tensor(r, dtype=dtype)
            if side == "left":
                out[i, width - len(r) :] = t
            else:
                out[i, : len(r)] = t
    return out


def collate_features(features: list[TrajectoryFeatures], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Pad per-trajectory features into TRL's batch layout (prompts left-padded, completions right-padded)."""
    prompt_ids = _pad([f.prompt_ids for f in features], pad_token_id, "left", torch.long)
    prompt_mask = _pad([[1] * len(f.prompt_ids) for f in features], 0, "left", torch.long)
    completion_ids = _pad([f.completion_ids for f in features], pad_token_id, "right", torch.long)
    completion_mask = _pad([[1] * len(f.completion_ids) for f in features], 0, "right", torch.long)
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": _pad([f.action_mask for f in features], 0, "right", torch.long),
        "env_output_mask": _pad([f.env_output_mask for f in features], 0, "right", torch.long),
        "warning_mask": _pad([f.warning_mask for f in features], 0, "right", torch.long),
        "world_mask": _pad([f.world_mask for f in features], 0, "right", torch.long),
    }
    if any(f.behavior_logps is not None for f in features):
        rows = [
            f.behavior_logps if f.behavior_logps is not None else [math.nan] * len(f.completion_ids) for f in features
        ]
        batch["old_per_token_logps"] = _pad(rows, math.nan, "right", torch.float32)
    return batch
