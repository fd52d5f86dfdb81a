"""Roles for conversational rows TRL has tokenized (``messages``, conversational prompt-completion).

TRL renders each conversation with the chat template and tokenizes it (``input_ids``), and builds ``labels`` from
its masks. A row whose conversation has tool messages or tool calls (or assistant turns, when ``action_weight`` is
not 1, or an episode ``min_reward`` keeps for its observations only) gets role weights on top
(:func:`~echo_trl.train.sft.weights.role_labels`); every other row keeps TRL's labels, untouched.

The roles are exact (echo_trl's exactness rule): :func:`echo_trl.tokens.tokenization.tokenize_rows` renders the
same conversation with the same template, tokenizes the whole text once, and gives each token the role of the
character span holding it (tool content found where the template put it, actions from the template's turn
markers), audited against the messages. Those ids must be TRL's ids, token for token; a row where they are not
(content that spells a special token, ``chat_template_kwargs`` that change the render, a template that cannot render
its tool calls) is refused in one line naming the row, never trained with roles that might be off by a token.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import EchoTrlError
from ...roles import Trajectory
from ...tokens.tokenization import tokenize_rows
from .weights import IGNORE_INDEX, SFTWeights, role_labels, trains_actions


def conversation_of(row: dict[str, Any]) -> tuple[list[dict], list[dict]] | None:
    """``(prompt, completion)`` messages of a conversational row: a ``messages`` row split before its first
    assistant turn (everything the model says is then in the completion), a prompt-completion row as given;
    ``None`` for a row without chat structure."""
    messages = row.get("messages")
    if _is_chat(messages):
        first = next((k for k, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
        return list(messages[:first]), list(messages[first:])
    prompt, completion = row.get("prompt"), row.get("completion")
    if _is_chat(prompt) and _is_chat(completion):
        return list(prompt), list(completion)
    return None


def _is_chat(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def has_tool_turns(messages: list[dict]) -> bool:
    """A tool message, or an assistant message with tool calls."""
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def needs_roles(completion: list[dict], weights: SFTWeights) -> bool:
    """Whether roles change anything for this completion: tool turns in it, or assistant turns weighted apart
    from TRL's mask."""
    return has_tool_turns(completion) or (
        weights.action_weight != 1.0 and any(m.get("role") == "assistant" for m in completion)
    )


def tools_of(row: dict[str, Any]) -> list:
    """The row's tool schemas as TRL passes them to the template (a JSON string is decoded, as TRL does)."""
    tools = row.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools)
    return list(tools or [])


def add_role_labels(
    batch: dict[str, list], indices: list[int], *, tokenizer, weights: SFTWeights, name: str
) -> dict[str, list]:
    """``Dataset.map`` (batched, with indices) over TRL-tokenized rows: ``labels`` with role weights where the row
    has roles, TRL's elsewhere."""
    rows = [{k: v[i] for k, v in batch.items()} for i in range(len(indices))]
    labels = list(batch["labels"])
    todo: list[tuple[int, Trajectory, bool]] = []
    for i, row in enumerate(rows):
        split = conversation_of(row)
        actions = trains_actions(row.get("reward"), weights.min_reward)
        if split is None or not (needs_roles(split[1], weights) or not actions):
            continue
        if not actions and not has_tool_turns(split[1]):  # nothing but actions to train, and they are filtered out
            labels[i] = [IGNORE_INDEX] * len(row["input_ids"])
            continue
        todo.append((i, Trajectory(prompt=split[0], completion=split[1], tools=tools_of(row)), actions))
    if not todo:
        return {"labels": labels}
    tokens = tokenize_rows(
        tokenizer,
        [t for _, t, _ in todo],
        [indices[i] for i, _, _ in todo],
        label=lambda index, _: f"{name} row {index}",
    )
    for (i, _, actions), tok in zip(todo, tokens, strict=True):
        ids = list(rows[i]["input_ids"])
        if tok.input_ids != ids:
            raise EchoTrlError(_mismatch(name, indices[i], ids, tok.input_ids, rows[i], tokenizer))
        labels[i] = role_labels(ids, labels[i], tok.roles, weights, train_actions=actions)
    return {"labels": labels}


def _mismatch(name: str, index: int, trl_ids: list[int], ids: list[int], row: dict, tokenizer) -> str:
    at = next((k for k, (a, b) in enumerate(zip(trl_ids, ids, strict=False)) if a != b), min(len(trl_ids), len(ids)))
    why = (
        "its chat_template_kwargs change the render"
        if row.get("chat_template_kwargs")
        else "its content spells a special token, or the template renders it differently"
    )
    return (
        f"{name} row {index}: TRL's tokens of this conversation differ from its exact render from token {at} "
        f"(TRL {tokenizer.decode(trl_ids[at : at + 8])!r} vs {tokenizer.decode(ids[at : at + 8])!r}; {why}), so its "
        "roles cannot be placed exactly; fix or drop the row"
    )
