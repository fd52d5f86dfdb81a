"""Offline mode: recorded trajectories instead of generated completions.

What the trainer needs to know about a trajectory dataset before TRL sees it: which datasets are
trajectories, which settings cannot work without generation, the reward source, and the columns
the dataloader must keep.
"""

from __future__ import annotations

from datasets import IterableDataset

from .advantages import ADVANTAGE_COLUMN, with_advantages
from .config import TRL_MAX_COMPLETION_LENGTH
from .errors import EchoTrlError

#: Columns of the ECHO trajectory schema that offline mode reads (kept by the dataloader).
TRAJECTORY_COLUMNS = ["prompt", "completion", "tools", "warnings", "reward", "group_id", "scenario", "task_idx",
                      "behavior_logprobs", ADVANTAGE_COLUMN, "valid_tool_call_pct", "parse_clean_pct",
                      "correct_pct"]
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


def is_trajectory_dataset(ds) -> bool:
    """A dataset of recorded trajectories (ECHO schema: ``prompt`` + ``completion`` messages)."""
    names = getattr(ds, "column_names", None) or []
    return "prompt" in names and "completion" in names


def has_behavior_logprobs(ds) -> bool:
    return "behavior_logprobs" in ds.column_names and any(v is not None for v in ds["behavior_logprobs"])


def check_settings(args, train_dataset, *, offline: bool, online: bool) -> None:
    """Raise :class:`EchoTrlError` for settings ECHO cannot train with (offline ones need no generation);
    an unset ``max_completion_length`` becomes TRL's default unless offline (whole recorded completions)."""
    if offline and online:
        raise EchoTrlError(
            "train_dataset holds recorded trajectories (a 'completion' column) but tools / rollout_func / "
            "environment_factory were also given: train offline on the recordings, or online with a prompt dataset")
    if offline and isinstance(train_dataset, IterableDataset):
        raise EchoTrlError("offline ECHO needs a map-style Dataset (advantages are grouped over the whole "
                           "dataset by group_id); load it without streaming")
    if offline and args.use_vllm:
        raise EchoTrlError("use_vllm generates completions; offline mode trains on recorded trajectories and "
                           "never generates: set use_vllm=False")
    if offline and args.multi_objective_aggregation != "sum_then_normalize":
        raise EchoTrlError("offline mode has one recorded reward per trajectory; "
                           "multi_objective_aggregation must be 'sum_then_normalize'")
    if offline and len(train_dataset) < args.generation_batch_size:
        raise EchoTrlError(
            f"train_dataset has {len(train_dataset)} trajectories, fewer than one generation batch "
            f"({args.generation_batch_size} = per_device_train_batch_size x processes x steps_per_generation)")
    if args.max_completion_length is None and not offline:
        args.max_completion_length = TRL_MAX_COMPLETION_LENGTH  # generation needs a bound
    if args.max_completion_length is None and args.loss_type == "dr_grpo":
        raise EchoTrlError("loss_type='dr_grpo' divides by max_completion_length: set it (offline it is unset by "
                           "default, keeping each recorded completion whole)")
    if args.use_liger_kernel and (args.liger_kernel_config or {}).get("fused_linear_cross_entropy"):
        raise EchoTrlError("Liger's fused linear cross-entropy replaces the forward and bypasses the per-token "
                           "log-probs the world term reuses; it is not supported")


def prepare_eval(eval_dataset, scale_rewards: str):
    """Held-out trajectories with advantages and :data:`EVAL_INDEX_COLUMN`; anything else as is."""
    if isinstance(eval_dataset, dict):
        return {k: prepare_eval(v, scale_rewards) for k, v in eval_dataset.items()}
    if eval_dataset is None or not is_trajectory_dataset(eval_dataset):
        return eval_dataset
    ds = with_advantages(eval_dataset, scale_rewards, "eval_dataset")
    if EVAL_INDEX_COLUMN in ds.column_names:
        ds = ds.remove_columns(EVAL_INDEX_COLUMN)
    return ds.add_column(EVAL_INDEX_COLUMN, list(range(len(ds))))
