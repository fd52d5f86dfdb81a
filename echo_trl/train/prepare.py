"""The datasets ``EchoGRPOTrainer`` trains and evaluates on, prepared once, at init, after TRL's ``__init__``.

After TRL's ``__init__`` because every step needs what it resolved: the tokenizer (``processing_class`` may be
a name, or absent) and the model (loaded by name; the starting-model log-probs forward it). In order:

1. every later tokenization with the trainer's tokenizer obeys ``max_rendered_chars``; trajectories are checked
   row-wise (:func:`~echo_trl.data.store.check_rows`: ``behavior_logprobs`` in range, one ``warnings`` list per
   completion message; datasets passed in Python are not loaded through it) and a train set must have a token to
   train (:func:`~echo_trl.train.step.trainable.require_trainable_tokens`);
2. offline, the recorded trajectories get their GRPO advantages
   (:func:`~echo_trl.train.offline.advantages.with_advantages`);
   held-out ones also get a row number (:func:`~echo_trl.train.offline.recorded.prepare_eval`);
3. trajectories get their cached tokens and rollout quality (:mod:`echo_trl.tokens.cache`, once per dataset and
   tokenizer), and every one must keep a completion token under ``max_completion_length``;
4. the train trajectories get the starting model's log-probs (``behavior_policy="initial"``,
   :mod:`echo_trl.train.offline.behavior`), or under ZeRO-3 / FSDP a row number and a :class:`StartingLogps` that adds
   them at the first batch;
5. every train trajectory gets its row number (:data:`~echo_trl.train.offline.collator.TRAIN_INDEX`), by which
   errors and warnings name a batch's rows.

Online datasets (prompts) pass through steps 2-4 as they are; online held-out trajectories are prepared as
offline ones.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..data.store import check_rows
from ..tokens.size_limit import DEFAULT_MAX_RENDERED_CHARS, set_max_rendered_chars
from . import trl_compat
from .offline.advantages import with_advantages
from .offline.behavior import StartingLogps, with_starting_logps
from .offline.collator import TRAIN_INDEX, CollatorSettings
from .offline.recorded import check_completion_room, is_trajectory_dataset, prepare_eval, with_tokens
from .step.trainable import require_trainable_tokens

__all__ = ["PreparedDatasets", "prepare_datasets"]


class PreparedDatasets(NamedTuple):
    train: Any  # what the trainer's ``train_dataset`` becomes
    eval: Any  # what its ``eval_dataset`` becomes (a dataset, a dict of them, or None)
    starting_logps: StartingLogps  # deferred to the first batch (ZeRO-3 / FSDP), else a no-op


def prepare_datasets(
    trainer, train_dataset, eval_dataset, settings: CollatorSettings, *, share: bool
) -> PreparedDatasets:
    """The final train and eval datasets of ``trainer`` (see the module docstring); ``share``: prefix sharing,
    which the starting-model forward uses too."""
    args = trainer.args
    tokenizer = trl_compat.tokenizer(trainer)
    set_max_rendered_chars(tokenizer, getattr(args, "max_rendered_chars", DEFAULT_MAX_RENDERED_CHARS))
    check_trajectories(args, train_dataset, eval_dataset)
    if is_trajectory_dataset(train_dataset):
        train_dataset = with_advantages(train_dataset, args.scale_rewards, "train_dataset")
    train_dataset = with_tokens(train_dataset, tokenizer)
    eval_dataset = prepare_eval(eval_dataset, args.scale_rewards, tokenizer)
    check_completion_room(train_dataset, args.max_completion_length, "train_dataset")
    evals = eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}
    for key, ds in evals.items():
        check_completion_room(ds, args.max_completion_length, f"eval_dataset{f'[{key!r}]' if key else ''}")
    train_dataset, starting = with_starting_logps(trainer, train_dataset, settings, share=share)
    if is_trajectory_dataset(train_dataset) and TRAIN_INDEX not in train_dataset.column_names:
        train_dataset = train_dataset.add_column(TRAIN_INDEX, list(range(len(train_dataset))))
    return PreparedDatasets(train_dataset, eval_dataset, starting)


def check_trajectories(args, train_dataset, eval_dataset) -> None:
    """Row values of every trajectory dataset (:func:`~echo_trl.data.store.check_rows`), and a train set with at
    least one token the configured loss terms train
    (:func:`~echo_trl.train.step.trainable.require_trainable_tokens`)."""
    evals = eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}
    named = [
        ("train_dataset", train_dataset),
        *((f"eval_dataset{f'[{k!r}]' if k else ''}", d) for k, d in evals.items()),
    ]
    for name, ds in named:
        if is_trajectory_dataset(ds):
            check_rows(ds, name)
    if is_trajectory_dataset(train_dataset):
        world = max(args.world_model_coeff, args.world_model_coeff_end or 0.0, *(args.world_model_coeff_values or [0]))
        target = args.world_loss_target if world > 0 else None
        require_trainable_tokens(train_dataset, "train_dataset", actions=args.use_policy_loss, world_target=target)
