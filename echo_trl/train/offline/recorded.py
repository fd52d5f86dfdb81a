"""Offline mode: recorded trajectories instead of generated completions.

What the trainer needs to know about a trajectory dataset before TRL sees it (which datasets are
trajectories, which settings cannot work without generation, the reward source, the columns the
dataloader must keep, the epoch order), and the batch it hands TRL's loss in place of a generated one
(:func:`collate_batch`).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from datasets import Dataset, IterableDataset
from trl.trainer.utils import RepeatSampler

from ...data.store import column_values
from ...errors import EchoTrlError
from ...tokens.cache import MESSAGE_ENDS, PROMPT_LENGTH, TOKEN_COLUMNS, add_row_column, tokenize_dataset
from .. import trl_compat
from ..sampler import ResumableRepeatSampler
from ..step import metrics
from ..step.loss import global_count, world_coeff_for
from ..step.trainable import untrainable_batch_message
from .advantages import ADVANTAGE_COLUMN, collated_advantages, with_advantages
from .collator import STARTING_LOGPS, TRAIN_INDEX, CollatorSettings, collate_features, trajectory_features

__all__ = ["recorded_reward", "no_reward"]

logger = logging.getLogger(__name__)

#: Columns of the ECHO trajectory schema that offline mode reads (kept by the dataloader).
TRAJECTORY_COLUMNS = [
    "prompt",
    "completion",
    "tools",
    "warnings",
    "reward",
    "group_id",
    "scenario",
    "task_idx",
    "behavior_logprobs",
    ADVANTAGE_COLUMN,
    "valid_tool_call_pct",
    "parse_clean_pct",
    "correct_pct",
    STARTING_LOGPS,
    *TOKEN_COLUMNS,
]
#: Row number :func:`prepare_eval` gives each held-out trajectory: the key that counts each one once.
EVAL_INDEX_COLUMN = "echo_eval_index"


def recorded_reward(completions, reward=None, **kwargs) -> list[float | None]:
    """Reward function that returns the dataset's ``reward`` column (the recorded episode reward)."""
    if reward is None:
        return [None] * len(completions)
    return [None if r is None else float(r) for r in reward]


def no_reward(completions, **kwargs) -> list[float]:
    """Reward function of verifier-free ECHO (``use_policy_loss=False``): every completion scores 0."""
    return [0.0] * len(completions)


def reward_source(reward_funcs, args, *, offline: bool, environment: bool):
    """The reward functions TRL gets: the recorded reward offline (unless others are given); for verifier-free
    ECHO (``use_policy_loss=False``) without an environment, :func:`no_reward` (TRL wants a reward source, the
    world term needs none)."""
    if offline and reward_funcs is None:
        return [recorded_reward]
    if reward_funcs is None and not args.use_policy_loss and not environment:
        return [no_reward]
    return reward_funcs


def is_trajectory_dataset(ds) -> bool:
    """A dataset of recorded trajectories (ECHO schema: ``prompt`` + ``completion`` messages)."""
    names = getattr(ds, "column_names", None) or []
    return "prompt" in names and "completion" in names


def check_settings(args, train_dataset, *, offline: bool, online: bool) -> None:
    """Raise :class:`EchoTrlError` for settings ECHO cannot train with (offline ones need no generation)."""
    if offline and online:
        raise EchoTrlError(
            "train_dataset holds recorded trajectories (a 'completion' column) but tools / rollout_func / "
            "environment_factory were also given: train offline on the recordings, or online with a prompt dataset"
        )
    if offline and isinstance(train_dataset, IterableDataset):
        raise EchoTrlError(
            "offline ECHO needs a map-style Dataset (advantages are grouped over the whole "
            "dataset by group_id); load it without streaming"
        )
    if offline and args.use_vllm:
        raise EchoTrlError(
            "use_vllm generates completions; offline mode trains on recorded trajectories and "
            "never generates: set use_vllm=False"
        )
    if offline and args.multi_objective_aggregation != "sum_then_normalize":
        raise EchoTrlError(
            "offline mode has one recorded reward per trajectory; "
            "multi_objective_aggregation must be 'sum_then_normalize'"
        )
    if offline and len(train_dataset) < args.generation_batch_size:
        raise EchoTrlError(
            f"train_dataset has {len(train_dataset)} trajectories, fewer than one generation batch "
            f"({args.generation_batch_size} = per_device_train_batch_size x processes x steps_per_generation)"
        )
    if args.max_completion_length is None and args.loss_type == "dr_grpo":
        raise EchoTrlError(
            "loss_type='dr_grpo' divides by max_completion_length: set it (offline it is unset by "
            "default, keeping each recorded completion whole)"
        )
    if args.use_liger_kernel and (args.liger_kernel_config or {}).get("fused_linear_cross_entropy"):
        raise EchoTrlError(
            "Liger's fused linear cross-entropy replaces the forward and bypasses the per-token "
            "log-probs the world term reuses; it is not supported"
        )


def prepare_eval(eval_dataset, scale_rewards: str, tokenizer=None):
    """Held-out trajectories with advantages and :data:`EVAL_INDEX_COLUMN` (and, given ``tokenizer``, their
    cached tokens: :func:`with_tokens`); anything else as is."""
    if isinstance(eval_dataset, dict):
        return {k: prepare_eval(v, scale_rewards, tokenizer) for k, v in eval_dataset.items()}
    if eval_dataset is None or not is_trajectory_dataset(eval_dataset):
        return eval_dataset
    ds = with_advantages(eval_dataset, scale_rewards, "eval_dataset")
    ds = ds.remove_columns([c for c in (EVAL_INDEX_COLUMN, STARTING_LOGPS) if c in ds.column_names])
    ds = add_row_column(ds, EVAL_INDEX_COLUMN, list(range(len(ds))))
    return ds if tokenizer is None else with_tokens(ds, tokenizer)


def with_tokens(dataset, tokenizer):
    """Trajectories (or a dict of them) with their cached token columns
    (:func:`echo_trl.tokens.cache.tokenize_dataset`, once per dataset and tokenizer),
    so no training or evaluation step renders a chat template; anything else, and streaming datasets
    (tokenized per step), as is."""
    if isinstance(dataset, dict):
        return {k: with_tokens(v, tokenizer) for k, v in dataset.items()}
    if not isinstance(dataset, Dataset) or not is_trajectory_dataset(dataset):
        return dataset
    return tokenize_dataset(dataset, tokenizer)


def prefix_groups(dataset) -> tuple[list, list | None]:
    """``(group_ids, scenario_ids)`` of a trajectory dataset: what :func:`echo_trl.prefix.order.prefix_grouped_order`
    keeps together (a group's rows share their prompt, a scenario's groups its tool preamble)."""
    names = dataset.column_names
    groups = column_values(dataset, "group_id") if "group_id" in names else list(range(len(dataset)))
    scenarios = column_values(dataset, "scenario") if "scenario" in names else None
    if scenarios is not None and any(s is None for s in scenarios):
        scenarios = None
    return groups, scenarios


def train_sampler(dataset, args, num_iterations: int, shuffle: bool, *, grouped: bool) -> ResumableRepeatSampler:
    """Each trajectory once per epoch (no ``num_generations`` repeats: groups come from ``group_id``); the repeat
    over ``steps_per_generation x num_iterations`` is TRL's buffering of one generation batch. ``grouped``: the
    epoch order keeps a group's (and a scenario's) rows together, for prefix sharing."""
    return ResumableRepeatSampler(
        data_source=dataset,
        mini_repeat_count=1,
        batch_size=args.generation_batch_size,
        repeat_count=num_iterations * args.steps_per_generation,
        shuffle=shuffle,
        seed=args.seed,
        groups=prefix_groups(dataset) if grouped else None,
    )


def eval_sampler(dataset) -> RepeatSampler:
    """Each held-out trajectory once, in order."""
    return RepeatSampler(data_source=dataset, mini_repeat_count=1, shuffle=False)


def check_completion_room(dataset, limit: int | None, name: str) -> None:
    """Every trajectory keeps at least one completion message under ``max_completion_length``.

    Completions are cut at message ends, so a limit shorter than a row's first message leaves that row
    with no completion token at all: it would train nothing, and a batch of such rows makes an empty
    completion that TRL's loss cannot take (a tensor-size RuntimeError deep in the step). Read from the
    cached token columns (:mod:`echo_trl.tokens.cache`): no second tokenization.
    """
    if limit is None or not isinstance(dataset, Dataset) or not set(TOKEN_COLUMNS) <= set(dataset.column_names):
        return
    if limit < 1:
        raise EchoTrlError(f"--max_completion_length {limit}: expected a positive number of tokens")
    firsts = first_message_tokens(dataset)
    empty = firsts[firsts > limit]
    if len(empty):
        raise EchoTrlError(
            f"--max_completion_length {limit} keeps no completion token of {len(empty)} of {len(firsts)} trajectories "
            f"in {name} (completions are cut at message ends and their first message alone has {int(empty.min())}-"
            f"{int(empty.max())} tokens): use at least {int(firsts.max())}"
        )


def first_message_tokens(dataset: Dataset) -> np.ndarray:
    """Tokens of each row's first completion message (0 for a row without one), from the cached token columns
    read as Arrow arrays (no row as Python values)."""
    table = dataset.select_columns([PROMPT_LENGTH, MESSAGE_ENDS]).with_format("arrow")[:]
    ends = table[MESSAGE_ENDS].combine_chunks()
    offsets = ends.offsets.to_numpy()
    values = ends.flatten().to_numpy(zero_copy_only=False)
    starts = offsets[:-1] - offsets[0]
    has = offsets[1:] > offsets[:-1]
    prompt = table[PROMPT_LENGTH].to_numpy()
    first = np.where(has, values[np.minimum(starts, max(len(values) - 1, 0))] if len(values) else 0, prompt)
    return (first - prompt).astype(np.int64)


def collate_batch(trainer, rows: list[dict[str, Any]], settings: CollatorSettings) -> dict[str, Any]:
    """Recorded trajectories -> the inputs TRL's ``_compute_loss`` expects, plus ECHO masks (no generation); logs
    the reward and length metrics TRL logs for a generated batch."""
    if trl_compat.is_vlm(trainer):
        raise EchoTrlError("offline ECHO supports text-only models (got a multimodal processor)")
    accelerator, args = trainer.accelerator, trainer.args
    device, mode, tokenizer = (
        accelerator.device,
        "train" if trainer.model.training else "eval",
        trl_compat.tokenizer(trainer),
    )
    features = [trajectory_features(tokenizer, row, settings) for row in rows]
    batch = {k: v.to(device) for k, v in collate_features(features, tokenizer.pad_token_id).items()}
    batch["advantages"], rewards = collated_advantages(rows, args.scale_rewards, accelerator.gather, device)
    for column in (EVAL_INDEX_COLUMN, TRAIN_INDEX):  # row numbers: held-out CE per trajectory, rows in messages
        if column in rows[0]:
            batch[column] = torch.tensor([row[column] for row in rows], device=device)
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    batch["num_items_in_batch"] = accelerator.gather(loss_mask.sum()).sum()
    batch["world_num_items"] = accelerator.gather(
        global_count(batch["world_mask"], args.world_loss_normalization).to(device)
    ).sum()
    if mode == "train":
        warn_if_untrainable(trainer, rows, batch)
    trl_compat.add_sampling_logps(
        trainer,
        batch,
        args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size,
    )
    m = trl_compat.metrics(trainer, mode)
    metrics.log_offline_batch(m, rewards, batch["advantages"], batch["completion_mask"], features, accelerator.gather)
    if mode == "train":
        tokens = batch["prompt_mask"].sum() + batch["completion_mask"].sum()
        trainer.state.num_input_tokens_seen += accelerator.gather(tokens).sum().item()
    m["num_tokens"] = [trainer.state.num_input_tokens_seen]
    return batch


def warn_if_untrainable(trainer, rows: list[dict[str, Any]], batch: dict[str, Any]) -> None:
    """A warning when a training batch (over every process) has no token the active loss terms train."""
    args, step = trainer.args, trainer.state.global_step
    actions = bool(args.use_policy_loss)
    world = world_coeff_for(args, step, trainer.state.max_steps) > 0
    trains = (actions and batch["num_items_in_batch"].item() > 0) or (world and batch["world_num_items"].item() > 0)
    if not trains:
        index = [row[TRAIN_INDEX] for row in rows] if TRAIN_INDEX in rows[0] else None
        logger.warning(untrainable_batch_message(step + 1, index, actions=actions, world=world))
