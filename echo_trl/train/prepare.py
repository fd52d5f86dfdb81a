"""The datasets ``EchoGRPOTrainer`` trains and evaluates on, prepared once, at init, after TRL's ``__init__``.

After TRL's ``__init__`` because every step needs what it resolved: the tokenizer (``processing_class`` may be
a name, or absent) and the model (loaded by name; the starting-model log-probs forward it). In order:

1. every later tokenization with the trainer's tokenizer obeys ``max_rendered_chars``;
2. offline, the recorded trajectories get their GRPO advantages (:func:`~echo_trl.train.advantages.with_advantages`);
   held-out ones also get a row number (:func:`~echo_trl.train.offline.prepare_eval`);
3. trajectories get their cached tokens and rollout quality (:mod:`echo_trl.tokens.cache`, once per dataset and
   tokenizer), and every one must keep a completion token under ``max_completion_length``;
4. the train trajectories get the starting model's log-probs (``behavior_policy="initial"``,
   :mod:`echo_trl.train.behavior`), or under ZeRO-3 / FSDP a row number and a :class:`StartingLogps` that adds
   them at the first batch.

Online datasets (prompts) pass through steps 2-4 as they are; online held-out trajectories are prepared as
offline ones.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..tokens.size_limit import DEFAULT_MAX_RENDERED_CHARS, set_max_rendered_chars
from . import trl_compat
from .advantages import with_advantages
from .behavior import StartingLogps, with_starting_logps
from .collator import CollatorSettings
from .offline import check_completion_room, is_trajectory_dataset, prepare_eval, with_tokens

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
    if is_trajectory_dataset(train_dataset):
        train_dataset = with_advantages(train_dataset, args.scale_rewards, "train_dataset")
    train_dataset = with_tokens(train_dataset, tokenizer)
    eval_dataset = prepare_eval(eval_dataset, args.scale_rewards, tokenizer)
    check_completion_room(train_dataset, args.max_completion_length, "train_dataset")
    evals = eval_dataset if isinstance(eval_dataset, dict) else {"": eval_dataset}
    for key, ds in evals.items():
        check_completion_room(ds, args.max_completion_length, f"eval_dataset{f'[{key!r}]' if key else ''}")
    train_dataset, starting = with_starting_logps(trainer, train_dataset, settings, share=share)
    return PreparedDatasets(train_dataset, eval_dataset, starting)
