"""Whether a dataset, or a batch, has anything to train: a run without a trainable token is refused, not "trained".

A trajectory trains the policy term on its action tokens (the assistant's turns, end-of-turn included) and the
world term on its world-target tokens (``env_only``: the content of tool messages; ``observation``: also the
template tokens around each tool message; ``all``: also the warnings). A dataset of empty or tool-only
completions has neither: training it used to exit 0 with a model bit-identical to the start.

* :func:`require_trainable_tokens` refuses such a whole dataset at trainer init, in one line (exit 2), from the
  message columns read as Arrow (no tokenizer, no row as a Python object, stops at the first row that trains).
  It is exact in the direction of the error: a dataset it refuses has no trainable token under any chat
  template (an assistant message renders at least its end-of-turn token; an empty string renders none).
* :func:`untrainable_batch_message` says, per batch, when the tokens that survived truncation, filters and
  masks leave nothing to train (a warning: other batches may still train).

:func:`guard_training` is the one call a trainer other than ``EchoGRPOTrainer`` (which wires the pieces into its
own steps) makes at init: the dataset check, the per-batch warning on the batches of its data collator (a
training batch whose ``labels`` are all ``-100``) and :class:`~echo_trl.train.step.finite.FiniteGuard`.
"""

from __future__ import annotations

import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ...errors import EchoTrlError
from .finite import FiniteGuard

__all__ = ["guard_training", "require_trainable_tokens", "untrainable_batch_message"]

logger = logging.getLogger(__name__)

#: Rows per Arrow batch read by :func:`require_trainable_tokens`.
SCAN_ROWS = 10_000


def require_trainable_tokens(dataset, name: str, *, actions: bool, world_target: str | None) -> None:
    """Refuse (:class:`EchoTrlError`) a trajectory dataset in which no row has a token the loss trains on.

    ``actions``: the action tokens train (a policy term, or an SFT action weight above 0); ``world_target``: the
    ``world_loss_target`` whose tokens train (``None`` when the world term is off). Datasets without the message
    columns (prompts, online) pass; so do streaming ones (their rows are checked per batch).
    """
    columns = [c for c in ("completion", "warnings") if c in (getattr(dataset, "column_names", None) or ())]
    if "completion" not in columns or not hasattr(dataset, "select_columns") or not len(dataset):
        return
    if not pa.types.is_list(dataset.features.arrow_schema.field("completion").type):
        return  # a text completion (TRL's standard prompt-completion): no messages, no roles to check
    if world_target != "all":
        columns = ["completion"]
    world = {
        "env_only": "a tool message with content (environment-output tokens for the world term)",
        "observation": "a tool message (observation tokens for the world term)",
        "all": "a tool message or a warning (world-term tokens)",
    }

    def trains(**terms: Any) -> bool:  # stops at the first Arrow batch that trains
        tables = dataset.select_columns(columns).with_format("arrow").iter(batch_size=SCAN_ROWS)
        return any(_trains(table, **terms) for table in tables)

    if trains(actions=actions, world_target=world_target):
        if actions and world_target and not trains(actions=False, world_target=world_target):
            # e.g. a collection whose replies were all empty: the run trains, but its world term has nothing
            logger.warning(
                f"{name}: none of its {len(dataset)} trajectories holds {world[world_target]}: the world-model "
                "term trains nothing, only the action tokens train (a collection of empty or tool-less episodes?)"
            )
        return
    wanted = [
        *(["an assistant message (action tokens)"] if actions else []),
        *([world[world_target]] if world_target else []),
    ]
    raise EchoTrlError(
        f"{name}: none of its {len(dataset)} trajectories has a token to train: no completion holds "
        f"{' or '.join(wanted) or 'a trained role (every loss term is off)'}: nothing would be trained (empty or "
        "tool-only completions?)"
    )


def _trains(table: pa.Table, *, actions: bool, world_target: str | None) -> bool:
    messages = pc.list_flatten(table.column("completion"))
    roles = pc.struct_field(messages, "role")
    if actions and pc.any(pc.equal(roles, "assistant")).as_py():
        return True
    if world_target is None:
        return False
    tool = pc.fill_null(pc.equal(roles, "tool"), False)
    if world_target != "env_only" and pc.any(tool).as_py():
        return True
    content = pc.fill_null(pc.utf8_length(pc.struct_field(messages, "content")), 0)
    if pc.any(pc.and_(tool, pc.greater(content, 0))).as_py():
        return True
    if world_target == "all":
        warnings = pc.list_flatten(pc.list_flatten(table.column("warnings")))
        return bool(pc.any(pc.greater(pc.fill_null(pc.utf8_length(warnings), 0), 0)).as_py())
    return False


def untrainable_batch_message(step: int, rows: list[int] | None, *, actions: bool, world: bool) -> str:
    """The per-batch warning: which rows, and which tokens they lack."""
    which = f"rows {', '.join(map(str, sorted(rows)))} of train_dataset" if rows else "this batch"
    parts = [*(["no action token (GRPO term)"] if actions else []), *(["no world-target token"] if world else [])]
    lacks = " and ".join(parts)
    return (
        f"step {step}: no trainable token in {which}: {lacks or 'every loss term is off'} after truncation and "
        "filters; this batch contributes no gradient"
    )


class _WarnUntrainableBatches:
    """A data collator that warns about a training batch whose ``labels`` are all ``-100`` (TRL's "no loss")."""

    def __init__(self, collate, trainer):
        self.collate, self.trainer = collate, trainer

    def __call__(self, rows: list[Any]):
        batch = self.collate(rows)
        labels = batch.get("labels") if isinstance(batch, dict) else None
        if labels is not None and self.trainer.model.training and not bool((labels != -100).any()):
            step = self.trainer.state.global_step + 1
            logger.warning(f"step {step}: no trainable token in this batch of {len(rows)} rows (every label is -100)")
        return batch


def guard_training(trainer, *, actions: bool, world_target: str | None) -> FiniteGuard:
    """At a trainer's init: refuse a train set with nothing to train (:func:`require_trainable_tokens`), warn per
    training batch without a trainable token, and stop before any non-finite update or save (:class:`FiniteGuard`)."""
    require_trainable_tokens(trainer.train_dataset, "train_dataset", actions=actions, world_target=world_target)
    trainer.data_collator = _WarnUntrainableBatches(trainer.data_collator, trainer)
    return FiniteGuard.added_to(trainer)
