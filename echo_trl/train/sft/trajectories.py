"""ECHO trajectory datasets (``echo-trl build-dataset``) as TRL pre-tokenized rows: ``input_ids`` and coded
``labels``.

These rows render differently from how TRL would render them (tool schemas and arguments stored as JSON text,
harness warnings appended to their tool message), so they are tokenized by echo_trl, once per dataset and tokenizer,
with the token cache ``echo-trl train`` shares (:func:`echo_trl.tokens.cache.tokenize_dataset`; a streaming dataset
row by row). TRL's masks on them are its prompt-completion ones: the prompt is left out with
``completion_only_loss`` (the default for prompt-completion data) and only the agent's turns are kept with
``assistant_only_loss``. ``max_completion_length`` cuts each completion at a message end first, as ``echo-trl train``
does; TRL then truncates to ``max_length`` and packs as it does any pre-tokenized dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from datasets import Dataset

from ...data.schema import REQUIRED_COLUMNS
from ...roles import Role
from ...tokens.cache import TOKEN_COLUMNS, row_tokens, tokenize_dataset
from ...tokens.tokenization import RoleTokens, tokenize_with_roles
from .weights import IGNORE_INDEX, SFTWeights, role_labels, trains_actions


def is_trajectory_dataset(dataset) -> bool:
    """A dataset in the ECHO trajectory schema (every column :data:`~echo_trl.data.schema.REQUIRED_COLUMNS` names)."""
    names = getattr(dataset, "column_names", None) or []
    return set(REQUIRED_COLUMNS) <= set(names)


def trl_mask(tokens: RoleTokens, *, completion_only: bool, assistant_only: bool) -> np.ndarray:
    """TRL's mask of one trajectory: 1 where its prompt-completion labels would train."""
    mask = np.ones(len(tokens.input_ids), dtype=bool)
    if completion_only:
        mask[: tokens.prompt_length] = False
    if assistant_only:
        mask &= tokens.roles == Role.ACTION.code
    return mask


def coded_row(
    tokens: RoleTokens, reward, weights: SFTWeights, *, completion_only: bool, assistant_only: bool
) -> dict[str, Any]:
    """``input_ids`` and coded ``labels`` of one trajectory's tokens."""
    if weights.max_completion_length is not None:
        tokens = tokens.truncate(tokens.prompt_length + weights.max_completion_length)
    ids = list(tokens.input_ids)
    mask = trl_mask(tokens, completion_only=completion_only, assistant_only=assistant_only)
    trl_labels = np.where(mask, np.asarray(ids, dtype=np.int64), IGNORE_INDEX)
    labels = role_labels(
        ids, trl_labels, tokens.roles, weights, train_actions=trains_actions(reward, weights.min_reward)
    )
    return {"input_ids": ids, "labels": labels}


def _cached(batch: dict[str, list], **kw) -> dict[str, list]:
    out: dict[str, list] = {"input_ids": [], "labels": []}
    for i in range(len(batch["prompt"])):
        row = {k: v[i] for k, v in batch.items()}
        coded = coded_row(row_tokens(row), row.get("reward"), **kw)
        out["input_ids"].append(coded["input_ids"])
        out["labels"].append(coded["labels"])
    return out


def _streamed(row: dict[str, Any], tokenizer, **kw) -> dict[str, Any]:
    return coded_row(tokenize_with_roles(tokenizer, row), row.get("reward"), **kw)


def with_role_labels(
    dataset, tokenizer, weights: SFTWeights, *, completion_only: bool, assistant_only: bool, num_proc: int | None
):
    """``dataset`` with ``input_ids`` and coded ``labels`` (the token cache's columns dropped again)."""
    kw = dict(weights=weights, completion_only=completion_only, assistant_only=assistant_only)
    if isinstance(dataset, Dataset):
        tokens = tokenize_dataset(dataset, tokenizer)
        return tokens.map(
            _cached,
            batched=True,
            fn_kwargs=kw,
            remove_columns=list(TOKEN_COLUMNS),
            num_proc=num_proc,
            desc="role weights of the trajectories",
        )
    return dataset.map(_streamed, fn_kwargs={"tokenizer": tokenizer, **kw})
