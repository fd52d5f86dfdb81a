"""Where a tool message's content is in rendered text: found once, here, for offline and online rows alike.

A chat template wraps each tool message's content in scaffolding (role headers, ``<tool_response>`` tags) and
may render the content verbatim, JSON-escaped or stripped. The content is found the same way in both modes: a
render with a random *probe* (:func:`probe_format`) in place of each content shows where the template puts it,
and the content is then matched there in one of its rendered forms (:func:`content_form`):

* offline, in the full conversation rendered by :mod:`echo_trl.tokens.template.layout`: :func:`content_starts`,
  from the probe's positions in the probe render (:func:`probe_positions`);
* online, in the tokens TRL's tool loop appended after a tool call (``tool_mask == 0``): :func:`tool_span_roles`,
  aligning the probe render of the same tool messages from the right (:func:`content_ranges`).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import TemplateError
from ...roles import Role
from .info import TemplateInfo, escaped

__all__ = ["probe_format", "content_form", "content_starts", "tool_span_roles"]

#: The ways a template may render a tool message's content, tried in this order where the template's own is unknown
#: (``"\\"`` is a prefix of its own escaped form ``"\\\\"``, so the escaped form goes first when it differs).
CONTENT_FORMS = ("escaped", "verbatim", "stripped")
#: The forms tried in a tool-loop span (TRL renders the tool messages itself).
ONLINE_FORMS = ("verbatim", "escaped")


def probe_format(*data: str) -> str:
    """A placeholder format (``.format(i)``) for locating rendered text: random, and absent from ``data``."""
    while True:
        tag = f"echoprobe{secrets.token_hex(8)}"
        if not any(tag in d for d in data):
            return tag + "_{}_"


def content_form(text: str, mode: str) -> str:
    """``text`` as a template renders it under ``mode`` (one of :data:`CONTENT_FORMS`)."""
    return escaped(text) if mode == "escaped" else text.strip() if mode == "stripped" else text


def form_at(text: str, content: str, modes: Sequence[str], *, start: int | None = None, end: int | None = None):
    """The first of ``modes`` whose form of ``content`` starts at ``start`` of ``text`` (or ends at ``end``),
    or ``None``."""
    for mode in modes:
        form = content_form(content, mode)
        if text.startswith(form, start) if start is not None else text.endswith(form, 0, end):
            return mode
    return None


# --------------------------------------------------------------------------------------------
# Offline: the whole conversation, rendered with probes and for real


def splice(probe_text: str, probe: str, contents: dict[int, str], mode: str) -> str:
    """The probe render with each probe replaced by its tool content as the template renders it."""
    out, last = [], 0
    for i in sorted(contents):
        probe_i = probe.format(i)
        at = probe_text.find(probe_i, last)
        out += [probe_text[last:at], content_form(contents[i], mode)]
        last = at + len(probe_i)
    out.append(probe_text[last:])
    return "".join(out)


_DIGITS = re.compile(r"(\d+)_")


def probe_positions(probe_text: str, probe: str, contents: dict[int, str]) -> dict[int, int]:
    """Where ``probe.format(i)`` is in ``probe_text`` for each tool message ``i``, found in one pass (a search
    from the start per message was quadratic); an error unless each occurs exactly once."""
    head = probe[: probe.index("{}")]  # the random tag and "_": then the index and "_"
    found: dict[str, list[int]] = {}
    at = probe_text.find(head)
    while at != -1:
        m = _DIGITS.match(probe_text, at + len(head))
        if m:
            found.setdefault(m.group(1), []).append(at)
        at = probe_text.find(head, at + 1)
    positions = {i: found.get(str(i), []) for i in contents}
    if any(len(at) != 1 for at in positions.values()):
        raise TemplateError("chat template does not render each tool message's content exactly once")
    return {i: at[0] for i, at in positions.items()}


def content_starts(
    info: TemplateInfo, text: str, probe_text: str, probe: str, probe_at: dict[int, int], contents: dict[int, str]
) -> dict[int, tuple[int, str]]:
    """Where each tool message's text starts in ``text``, and the form the template gave it."""
    starts: dict[int, tuple[int, str]] = {}
    shift = 0
    for i in sorted(contents):
        pos = probe_at[i] + shift
        # A prefix test alone is ambiguous: trust the template's known form, else try each (CONTENT_FORMS).
        mode = form_at(text, contents[i], [info.tool_content] if info.tool_content else CONTENT_FORMS, start=pos)
        if mode is None:
            raise TemplateError(
                f"chat template alters the text of tool message {i} (neither verbatim, JSON-escaped nor stripped)"
            )
        starts[i] = (pos, mode)
        shift += len(content_form(contents[i], mode)) - len(probe.format(i))
    if len(probe_text) + shift != len(text):
        raise TemplateError("chat template renders tool output in a content-dependent way; cannot align roles")
    return starts


# --------------------------------------------------------------------------------------------
# Online: the tokens TRL's tool loop appended after a tool call


def zero_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` runs of zeros in ``mask``."""
    spans, start = [], None
    for i, v in enumerate(list(mask) + [1]):
        if v == 0 and start is None:
            start = i
        elif v != 0 and start is not None:
            spans.append((start, i))
            start = None
    return spans


def tool_message_groups(messages: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive runs of ``tool`` messages (one run per tool-loop iteration of TRL)."""
    groups, current = [], []
    for m in messages:
        if m.get("role") == "tool":
            current.append(m)
        elif current:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def token_char_starts(tokenizer, ids: Sequence[int]) -> tuple[str, list[int]]:
    """The decoded text of ``ids`` and the character where each token starts."""
    ids = list(ids)
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(enc["input_ids"]) == ids:
            return text, [int(a) for a, _ in enc["offset_mapping"]]
    except (NotImplementedError, ValueError, TypeError):  # slow tokenizers have no offsets
        pass
    starts = [
        len(tokenizer.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False))
        for k in range(len(ids))
    ]
    return text, starts


def content_ranges(text: str, probe_text: str, probe: str, contents: list[str]) -> list[tuple[int, int]] | None:
    """Char ranges of ``contents`` in ``text``, aligning the template pieces of ``probe_text`` from the right."""
    pieces = []  # static template text between probes: seg_0, ..., seg_K
    rest = probe_text
    for k in range(len(contents)):
        probe_k = probe.format(k)
        if rest.count(probe_k) != 1:
            return None
        before, rest = rest.split(probe_k)
        pieces.append(before)
    pieces.append(rest)
    end = len(text)
    ranges: list[tuple[int, int]] = []
    for k in range(len(contents), 0, -1):
        seg = pieces[k]
        if not text[:end].endswith(seg):
            return None
        end -= len(seg)
        mode = form_at(text, contents[k - 1], ONLINE_FORMS, end=end)
        if mode is None:
            return None
        start = end - len(content_form(contents[k - 1], mode))
        ranges.append((start, end))
        end = start
    if not pieces[0].endswith(text[:end]):
        return None  # the span should begin inside the template text before the first tool message
    return ranges[::-1]


def tool_span_roles(
    tokenizer,
    completion_ids: Sequence[int],
    tool_mask: Sequence[int],
    completion_messages: Sequence[dict[str, Any]],
    render_suffix: Callable[..., str],
) -> list[int] | None:
    """Role code of each token: action where ``tool_mask == 1``; inside each ``tool_mask == 0`` span env output
    (tool-output content), context (the next generation prompt) or observation (the template's wrapper).

    ``render_suffix(tool_messages, add_generation_prompt=True)`` renders the text TRL tokenized for a
    span (the tool messages and the next generation prompt, after the template scaffolding that precedes
    them); it is called with probe contents to learn where the template puts each message's content, and
    once more without the generation prompt: TRL appends the assistant header of the next turn to the tool
    suffix, while offline collation (``layout.py``) leaves that header context, so online it is context too.
    A token's role is the role of its first character (as in ``tokenize_with_roles``).
    Returns ``None`` when a span cannot be aligned (the caller counts it and trains nothing there).
    """
    roles = [Role.ACTION.code if v else Role.OBSERVATION.code for v in tool_mask][: len(completion_ids)]
    spans = zero_spans(tool_mask)
    groups = tool_message_groups(completion_messages)
    if len(spans) != len(groups):
        return None
    for (a, b), group in zip(spans, groups, strict=True):
        contents = [m.get("content") for m in group]
        text, starts = token_char_starts(tokenizer, completion_ids[a:b])
        bounds = np.asarray(starts)
        probe = probe_format(text, *(c for c in contents if isinstance(c, str)))
        probed = [{**m, "content": probe.format(k)} for k, m in enumerate(group)]
        with_prompt = render_suffix(probed)
        without = render_suffix(probed, add_generation_prompt=False)
        prompt_len = len(with_prompt) - len(without) if with_prompt.startswith(without) else 0
        if prompt_len and text.endswith(with_prompt[-prompt_len:]):
            for j in np.flatnonzero(bounds >= len(text) - prompt_len):
                roles[a + int(j)] = Role.CONTEXT.code
        if not all(isinstance(c, str) for c in contents):
            continue  # multimodal tool output: no text to learn
        ranges = content_ranges(text, with_prompt, probe, contents)
        if ranges is None:
            return None
        for lo, hi in ranges:
            for j in np.flatnonzero((bounds >= lo) & (bounds < hi)):
                roles[a + int(j)] = Role.ENV_OUTPUT.code
    return roles
