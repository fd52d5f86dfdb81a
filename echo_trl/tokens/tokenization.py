"""Exact per-token roles: render once with the model's chat template, tokenize once.

The exactness rule: the token ids are those of the whole conversation rendered by the model's own
chat template, tokenized in one piece (``tokenizer(rendered_text, add_special_tokens=False)``;
tokenizing per message would drift at BPE merges across message boundaries), where only the special
tokens the template itself rendered act as special tokens. Text inside the conversation that spells a
special token (a tool output holding ``<|im_end|>\n<|im_start|>assistant``, a task, a tool schema)
stays text: it is tokenized as ``split_special_tokens=True`` tokenizes it, so no content can open or
close a turn. For a conversation without such text the two readings are the same ids. With it, the
text between the template's special tokens is tokenized piece by piece (special tokens already split
a text before BPE runs, so the pieces are what the whole-text tokenization would cut anyway); that
this reproduces the whole-text ids is checked on the same conversation with the special-token text
neutralized, and an error says so when a tokenizer does not allow it.

:func:`echo_trl.tokens.template.layout.layout` gives every character of the rendered text a role; a token takes the
role of the span holding its first character (a BPE token that merges the last character of a tool
output with the newline after it counts as env output).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..data.schema import row_to_trajectory
from ..errors import EchoTrlError, TemplateError
from ..roles import Role, Trajectory
from .audit import RoleAuditError, audit_roles
from .size_limit import check_content_size, check_rendered_size
from .template.layout import WARNING_SEPARATOR, Layout, layout, tokenizer_state
from .world_mask import target_codes, world_mask

__all__ = [
    "WARNING_SEPARATOR",
    "RoleAuditError",
    "RoleTokens",
    "TruncationError",
    "annotate_roles",
    "layout",
    "tokenize_batch",
    "tokenize_with_roles",
]


class TruncationError(EchoTrlError):
    """The prompt alone does not fit in ``max_length``: there is nothing left to train on."""


@dataclass
class RoleTokens:
    """Token ids of one trajectory with aligned, disjoint role masks."""

    input_ids: list[int]
    roles: np.ndarray  # int8 per token: a Role.code
    prompt_length: int  # tokens before the first action token: where the completion starts
    world_loss_target: str = "env_only"
    truncated_tokens: int = 0  # tokens cut by max_length (reported, never silent)
    truncated_messages: int = 0  # completion messages cut by max_length
    text: str = ""  # the rendered text the ids tokenize (after truncation)
    message_token_spans: list[tuple[int, int]] = field(default_factory=list)  # per completion message
    message_char_ends: list[int] = field(default_factory=list)  # per completion message, in ``text``
    completion_char_start: int = 0  # where the first action begins in ``text``

    def __len__(self) -> int:
        return len(self.input_ids)

    def truncate(self, max_length: int) -> RoleTokens:
        """These tokens cut to ``max_length`` at the end of a completion message (no re-tokenization).

        Ids are a prefix of the whole-text ids, and a cut at a message end (an end-of-turn token)
        is a token boundary, so the result equals tokenizing the kept text. What was cut adds to
        ``truncated_tokens`` / ``truncated_messages``. Raises :class:`TruncationError` when even
        the prompt does not fit.
        """
        if len(self.input_ids) <= max_length:
            return self
        if self.prompt_length > max_length:
            raise TruncationError(
                f"the prompt alone has {self.prompt_length} tokens, more than max_length={max_length}"
            )
        keep = sum(1 for _, end in self.message_token_spans if end <= max_length)  # ends increase
        cut = self.message_token_spans[keep - 1][1] if keep else self.prompt_length
        char_cut = self.message_char_ends[keep - 1] if keep else self.completion_char_start
        return RoleTokens(
            self.input_ids[:cut],
            self.roles[:cut].copy(),
            self.prompt_length,
            self.world_loss_target,
            truncated_tokens=self.truncated_tokens + len(self.input_ids) - cut,
            truncated_messages=self.truncated_messages + len(self.message_token_spans) - keep,
            text=self.text[:char_cut],
            message_token_spans=self.message_token_spans[:keep],
            message_char_ends=self.message_char_ends[:keep],
            completion_char_start=self.completion_char_start,
        )

    def mask(self, *roles: Role) -> list[int]:
        """1 on the tokens of any of ``roles``, 0 elsewhere."""
        return np.isin(self.roles, [r.code for r in roles]).astype(np.int64).tolist()

    @property
    def action_mask(self) -> list[int]:
        return self.mask(Role.ACTION)

    @property
    def env_output_mask(self) -> list[int]:
        return self.mask(Role.ENV_OUTPUT)

    @property
    def warning_mask(self) -> list[int]:
        return self.mask(Role.WARNING)

    @property
    def observation_mask(self) -> list[int]:
        """Template wrapper tokens of tool messages (not their content)."""
        return self.mask(Role.OBSERVATION)

    @property
    def world_mask(self) -> list[int]:
        """Tokens the world-model loss trains on under ``world_loss_target`` (no cap, no filter)."""
        return world_mask(self.roles, self.world_loss_target).astype(np.int64).tolist()

    def counts(self) -> dict[str, int]:
        """Tokens per message role (the template's tool-message wrapper counts as context)."""
        c = np.bincount(self.roles, minlength=len(Role))
        return {
            "context": int(c[Role.CONTEXT.code] + c[Role.OBSERVATION.code]),
            "action": int(c[Role.ACTION.code]),
            "env_output": int(c[Role.ENV_OUTPUT.code]),
            "warning": int(c[Role.WARNING.code]),
        }


class _Encoder:
    """Encodes rendered conversations; reuses the tokens of a shared preamble.

    The system turn (system prompt + tool schemas) is identical across a scenario's episodes
    and is most of an AWM episode's text. Added special tokens split the input before BPE
    runs, so tokenizing ``text[:p]`` and ``text[p:]`` separately, where ``p`` ends a special
    end-of-turn token, gives exactly the ids of tokenizing ``text`` whole. That is checked
    against a whole-text encode the first time per tokenizer; on any mismatch the cache is
    switched off for that tokenizer (and a warning says so).

    The cache keeps the ``max_entries`` preambles used last (least recently used goes first), but a
    batch's own preambles are pinned while it is encoded: they are looked up in the batch's own table,
    so a batch that interleaves more scenarios than the cache holds (a shuffled AWM-1K dataset: up to
    64 of 1,000 scenarios in one batch) never loses one it still needs.
    """

    def __init__(self, tokenizer, max_entries: int = 64):
        self.tokenizer = tokenizer
        self.cache: dict[str, tuple[list[int], np.ndarray]] = {}
        self.max_entries = max_entries
        self.verified = False
        self.enabled = True

    def _raw(self, texts: list[str]) -> list[tuple[list[int], np.ndarray]]:
        if not texts:
            return []
        enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            (list(ids), np.asarray(offs, dtype=np.int64).reshape(-1, 2)[:, 0])
            for ids, offs in zip(enc["input_ids"], enc["offset_mapping"], strict=True)
        ]

    def _preambles(self, pres: list[str]) -> dict[str, tuple[list[int], np.ndarray]]:
        """The tokens of every preamble of one batch (pinned: the batch's own table), the cache refreshed after."""
        needed = dict.fromkeys(p for p in pres if p)  # first-use order
        missing = [p for p in needed if p not in self.cache]
        table = {p: self.cache[p] for p in needed if p in self.cache}
        table.update(zip(missing, self._raw(missing), strict=True))
        for pre in needed:  # most recently used last
            self.cache.pop(pre, None)
            self.cache[pre] = table[pre]
        while len(self.cache) > self.max_entries:
            self.cache.pop(next(iter(self.cache)))
        return table

    def encode(self, texts: list[str], splits: list[int]) -> list[tuple[list[int], np.ndarray]]:
        """Ids and token start offsets of each text; ``splits[i]`` is a safe preamble end (0: none)."""
        if not self.enabled:
            return self._raw(texts)
        pres = [t[:p] for t, p in zip(texts, splits, strict=True)]
        table = self._preambles(pres)
        rests = self._raw([t[len(p) :] for t, p in zip(texts, pres, strict=True)])
        out = []
        for pre, (ids, starts) in zip(pres, rests, strict=True):
            if pre:
                pids, pstarts = table[pre]
                ids, starts = pids + ids, np.concatenate([pstarts, starts + len(pre)])
            out.append((ids, starts))
        if not self.verified and texts:
            self.verified = True
            whole = self._raw(texts[:1])[0]
            if whole[0] != out[0][0] or not np.array_equal(whole[1], out[0][1]):
                warnings.warn(
                    "echo_trl: preamble token cache does not reproduce whole-text tokenization for "
                    "this tokenizer; tokenizing every conversation whole (slower, still exact)",
                    stacklevel=3,
                )
                self.enabled = False
                self.cache.clear()
                return self._raw(texts)
        return out


def _encode_pieces(tokenizer, text: str, specials: list[tuple[int, int]]) -> tuple[list[int], np.ndarray]:
    """Ids and token start offsets of ``text``: the ``specials`` spans as special tokens, everything between
    them tokenized as text (special-token text included)."""
    pieces, bounds, last = [], [], 0
    for a, b in [*specials, (len(text), len(text))]:
        if a > last:
            pieces.append(text[last:a])
            bounds.append(last)
        last = b
    enc = (
        tokenizer(pieces, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
        if pieces
        else {"input_ids": [], "offset_mapping": []}
    )
    parts = {
        start: (list(ids), [off[0] + start for off in offs])
        for start, ids, offs in zip(bounds, enc["input_ids"], enc["offset_mapping"], strict=True)
    }
    parts |= {a: ([tokenizer.convert_tokens_to_ids(text[a:b])], [a]) for a, b in specials}
    ids, starts = [], []
    for start in sorted(parts):
        ids += parts[start][0]
        starts += parts[start][1]
    return ids, np.asarray(starts, dtype=np.int64)


def _encode_with_literal_specials(tokenizer, lay: Layout) -> tuple[list[int], np.ndarray]:
    """:func:`_encode_pieces` of a text holding special-token text, after checking on its neutralized twin
    that tokenizing between the template's special tokens reproduces the whole-text ids."""
    whole = tokenizer(lay.neutral_text, add_special_tokens=False)["input_ids"]
    if list(whole) != _encode_pieces(tokenizer, lay.neutral_text, lay.template_specials)[0]:
        raise TemplateError(
            "the conversation holds special-token text, and this tokenizer does not tokenize the "
            "text between special tokens independently, so it cannot be kept as text exactly"
        )
    return _encode_pieces(tokenizer, lay.text, lay.template_specials)


def _encoder(tokenizer) -> _Encoder:
    state = tokenizer_state(tokenizer)
    if state.encoder is None:
        state.encoder = _Encoder(tokenizer)
    return state.encoder


def tokenize_with_roles(
    tokenizer,
    row: dict[str, Any] | Trajectory,
    *,
    max_length: int | None = None,
    world_loss_target: str = "env_only",
    audit: bool = True,
) -> RoleTokens:
    """Token ids of a trajectory (dataset row or :class:`Trajectory`) with per-token roles.

    ``max_length`` cuts at the end of a completion message (never inside one), keeping masks
    aligned; what was cut is reported in ``truncated_tokens`` / ``truncated_messages``.
    Raises :class:`TruncationError` if even the prompt does not fit. ``audit`` (on by default) checks the
    roles against the messages (:mod:`echo_trl.tokens.audit`) and raises :class:`RoleAuditError` on a
    mismatch.
    """
    return tokenize_batch(tokenizer, [row], max_length=max_length, world_loss_target=world_loss_target, audit=audit)[0]


def tokenize_batch(
    tokenizer,
    rows: list[dict[str, Any] | Trajectory],
    *,
    max_length: int | None = None,
    world_loss_target: str = "env_only",
    audit: bool = True,
) -> list[RoleTokens]:
    """:func:`tokenize_with_roles` for many trajectories: one batched (parallel, Rust) encode."""
    target_codes(world_loss_target)  # validate early
    layouts = [_bounded_layout(tokenizer, r if isinstance(r, Trajectory) else row_to_trajectory(r)) for r in rows]
    plain = [lay for lay in layouts if lay.template_specials is None]
    encoded = dict(
        zip(
            map(id, plain),
            _encoder(tokenizer).encode([lay.text for lay in plain], [lay.preamble_end for lay in plain]),
            strict=True,
        )
    )
    for lay in layouts:
        if lay.template_specials is not None:
            encoded[id(lay)] = _encode_with_literal_specials(tokenizer, lay)
    return [_assign(lay, *encoded[id(lay)], max_length, world_loss_target, audit) for lay in layouts]


def _bounded_layout(tokenizer, trajectory: Trajectory) -> Layout:
    """:func:`layout` of a trajectory within the rendered-size bound (:mod:`echo_trl.tokens.size_limit`)."""
    check_content_size(tokenizer, trajectory)
    lay = layout(tokenizer, trajectory)
    check_rendered_size(tokenizer, lay.text)
    return lay


def tokenize_rows(
    tokenizer,
    rows: list[dict[str, Any]],
    indices: list[int],
    *,
    max_length: int | None = None,
    label: Callable[[int, dict[str, Any]], str] | None = None,
    audit: bool = True,
) -> list[RoleTokens]:
    """:func:`tokenize_batch`, and on failure the same error naming the row that fails (``row N``, or
    ``label(index, row)``): found by retrying row by row, so the batched encode stays the fast path."""
    try:
        return tokenize_batch(tokenizer, rows, max_length=max_length, audit=audit)
    except EchoTrlError:
        for index, row in zip(indices, rows, strict=True):
            try:
                tokenize_batch(tokenizer, [row], max_length=max_length, audit=audit)
            except EchoTrlError as exc:
                raise type(exc)(f"{label(index, row) if label else f'row {index}'}: {exc}") from None
        raise


def _assign(
    lay: Layout, ids: list[int], starts: np.ndarray, max_length: int | None, target: str, audit: bool = True
) -> RoleTokens:
    n_chars = len(lay.text)
    token_roles = lay.char_roles[np.minimum(starts, max(n_chars - 1, 0))] if n_chars else np.zeros(0, np.int8)
    if audit:
        prompts = lay.info.generation_prompts
        info = lay.info
        audit_roles(
            lay.text,
            starts,
            token_roles,
            lay.completion,
            lay.warnings,
            prompts,
            info.special_tokens,
            info.added_tokens,
        )
    prompt_length = int(np.searchsorted(starts, lay.completion_start, side="left"))
    ends = [int(np.searchsorted(starts, e, side="left")) for e in lay.message_ends]
    spans = [(prompt_length if k == 0 else ends[k - 1], ends[k]) for k in range(len(ends))]
    result = RoleTokens(
        ids,
        token_roles.astype(np.int8),
        prompt_length,
        target,
        text=lay.text,
        message_token_spans=spans,
        message_char_ends=list(lay.message_ends),
        completion_char_start=lay.completion_start,
    )
    return result if max_length is None else result.truncate(max_length)


def annotate_roles(tokenizer, tokens: RoleTokens, *, hide_context_over: int | None = 400) -> str:
    """The decoded conversation with each run of same-role tokens wrapped in ``[role]...[/role]``.

    Context runs longer than ``hide_context_over`` characters (tool schemas) are elided, so a
    person can check at a glance which tokens each loss trains on.
    """
    out, start = [], 0
    roles = tokens.roles
    for i in range(1, len(roles) + 1):
        if i == len(roles) or roles[i] != roles[start]:
            text = tokenizer.decode(tokens.input_ids[start:i])
            role = Role.of_code(roles[start])
            if role is Role.CONTEXT:
                if hide_context_over is not None and len(text) > hide_context_over:
                    half = hide_context_over // 2
                    text = f"{text[:half]}[... {len(text) - 2 * half} characters ...]{text[-half:]}"
                out.append(text)
            else:
                out.append(f"[{role}]{text}[/{role}]")
            start = i
    return "".join(out)
