"""The SFT stage's dataset preparation: TRL's, with role weights added where rows have roles.

``SFTTrainer._prepare_dataset`` (TRL 1.16) runs, in order: the formatting function, the ChatML conversion, EOS
for plain text, tokenization (``input_ids`` and its masks), ``labels`` from the masks, truncation to ``max_length``,
the drop of fully masked rows, packing and the shuffle. Role weights must enter after ``labels`` and before
truncation. So a conversational dataset is prepared in two calls of TRL's own preparation:

1. up to ``labels``: the same call with ``max_length=None`` (no truncation), no packing and no shuffle;
2. :func:`~echo_trl.train.sft.conversation.add_role_labels` codes the weights into ``labels``;
3. the rest: the same call again, on what is now a pre-tokenized dataset with labels (TRL skips what is done and
   truncates, drops, packs and shuffles exactly as it would have).

Every other dataset (plain text, standard prompt-completion, pre-tokenized, a ``formatting_func``) has no roles and
goes through TRL's preparation once, as it is. An ECHO trajectory dataset is tokenized by echo_trl
(:mod:`.trajectories`) and handed to TRL as a pre-tokenized one.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

from datasets import Dataset
from trl.data_utils import get_dataset_column_names, is_conversational, is_conversational_from_value

from .conversation import add_role_labels
from .trajectories import is_trajectory_dataset, with_role_labels
from .weights import SFTWeights

logger = logging.getLogger(__name__)

#: ``(dataset, processing_class, args, packing, formatting_func, name) -> dataset``: TRL's preparation.
Prepare = Callable


def has_chat_structure(dataset) -> bool:
    """A conversational dataset (TRL's test, on the first row; ShareGPT's from/value rows included)."""
    first = next(iter(dataset))
    return is_conversational(first) or is_conversational_from_value(first)


def with_template(tokenizer, chat_template: str | None):
    """``tokenizer``, or a shallow copy rendering with ``chat_template`` (the original is left as it is)."""
    if chat_template is None or chat_template == tokenizer.chat_template:
        return tokenizer
    copied = copy.copy(tokenizer)
    copied.chat_template = chat_template
    return copied


def prepare_sft_dataset(
    trl_prepare: Prepare,
    dataset,
    processing_class,
    args,
    packing: bool,
    formatting_func,
    name: str,
    *,
    tokenizer,
    weights: SFTWeights,
    completion_only: bool,
    chat_template: str | None = None,
) -> Dataset:
    """What ``SFTTrainer._prepare_dataset`` returns for ``dataset``, with role weights in ``labels`` where rows have
    roles (module docstring). ``chat_template``: the template TRL renders with when it is not the tokenizer's (its
    training template with generation markers, for ``assistant_only_loss``)."""
    map_kwargs = {"num_proc": args.dataset_num_proc} if isinstance(dataset, Dataset) else {}
    if is_trajectory_dataset(dataset):
        dataset = with_role_labels(
            dataset,
            tokenizer,
            weights,
            completion_only=completion_only,
            assistant_only=args.assistant_only_loss,
            num_proc=map_kwargs.get("num_proc"),
        )
        return trl_prepare(dataset, processing_class, args, packing, None, name)
    processed = "input_ids" in get_dataset_column_names(dataset)
    if formatting_func is not None or processed or not has_chat_structure(dataset):
        return trl_prepare(dataset, processing_class, args, packing, formatting_func, name)
    front = copy.copy(args)
    front.max_length, front.shuffle_dataset = None, False
    dataset = trl_prepare(dataset, processing_class, front, False, None, name)
    if isinstance(dataset, Dataset):
        map_kwargs["desc"] = f"Role weights of {name} dataset"
    dataset = dataset.map(
        add_role_labels,
        batched=True,
        with_indices=True,
        fn_kwargs={"tokenizer": with_template(tokenizer, chat_template), "weights": weights, "name": name},
        **map_kwargs,
    )
    return trl_prepare(dataset, processing_class, args, packing, None, name)
