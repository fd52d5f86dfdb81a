"""Render a trajectory with the model's chat template and give every character a role.

Template facts (how messages must be shaped, where the model's prompt ends, which tokens end an
assistant turn, how tool content is inserted) are derived once per tokenizer from probe renders
(:mod:`echo_trl.tokens.template.info`) and kept, with everything else derived per tokenizer, in one
:class:`TokenizerState` (see :func:`tokenizer_state`).

Roles come from character spans in the rendered text:

* ``env_output``: the characters of each tool message's content (where the template put them, found
  with a probe render, so a tool output that also appears in the scaffolding is never mistaken for it);
* ``warning``: harness warnings, rendered after the tool output inside the same tool message;
* ``action``: what the model generates for an assistant turn: from where its prompt ends (the template's
  text after the previous message, up to and including what ``add_generation_prompt`` adds, as far as
  the turn agrees with it) through the token that ends the turn (an EOS, ``<|call|>``, ``<|observation|>``
  ...), found after the turn's last call or content;
* ``observation``: the template's wrapper around tool messages (role headers, ``<tool_response>`` tags)
  between an action's end and the next action's start;
* ``context``: everything else (system prompt, tools, task, other scaffolding).

Every role is then checked independently of this derivation by :mod:`echo_trl.tokens.audit`.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import TemplateError
from ...roles import Role, Trajectory
from .info import (
    AFTER_TOOL,
    AFTER_USER,
    CALL,
    PLAIN,
    TemplateInfo,
    adapt_messages,
    derive_template_info,
    escaped,
    render,
)
from .special_text import neutralized, template_specials
from .tool_content import content_form, content_starts, probe_format, probe_positions, splice

#: How warnings are appended to a tool message's rendered text (never into its stored content).
WARNING_SEPARATOR = "\n\n"


@dataclass
class TokenizerState:
    """Everything derived once per tokenizer: template facts (with and without tool schemas), whether
    splicing tool text into a probe render reproduces the real render (checked once), and the
    preamble-caching encoder."""

    tokenizer: Any
    template_key: str | None = None  # the chat template ``infos`` and ``splice_ok`` were derived from
    infos: dict[bool, TemplateInfo] = field(default_factory=dict)  # by "rendered with tool schemas"
    splice_ok: dict[bool, bool] = field(default_factory=dict)  # absent: not checked yet
    encoder: Any = None  # tokenization's preamble-caching encoder, built on first use


_STATES: dict[int, TokenizerState] = {}


def tokenizer_state(tokenizer) -> TokenizerState:
    """The one :class:`TokenizerState` of ``tokenizer`` (template facts reset when its template changes)."""
    state = _STATES.get(id(tokenizer))
    if state is None or state.tokenizer is not tokenizer:
        state = _STATES[id(tokenizer)] = TokenizerState(tokenizer)
    template = getattr(tokenizer, "chat_template", None)
    key = template if isinstance(template, str) or template is None else json.dumps(template)
    if key != state.template_key:
        state.template_key, state.infos, state.splice_ok = key, {}, {}
    return state


def template_info(tokenizer, tools: list[dict] | None = None) -> TemplateInfo:
    """The facts of ``tokenizer``'s chat template, probed with ``tools`` (cached per template and per
    whether tool schemas are rendered)."""
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; ECHO renders each "
            "trajectory with the model's own template (set tokenizer.chat_template)"
        )
    state = tokenizer_state(tokenizer)
    with_tools = bool(tools)
    if with_tools not in state.infos:
        state.infos[with_tools] = derive_template_info(tokenizer, tools or None)
    return state.infos[with_tools]


class Occurrences:
    """``text.find(needle, start)`` in O(log n) per call: every occurrence of a needle (overlapping ones
    included) is listed once, on first use. Searching the whole rest of a long text for a marker that
    does not occur again, once per message, made layouts quadratic in episode length."""

    def __init__(self, text: str):
        self.text = text
        self._at: dict[str, list[int]] = {}

    def all(self, needle: str) -> list[int]:
        """Start of every occurrence of ``needle`` in the text, ascending."""
        at = self._at.get(needle)
        if at is None:
            at, i = [], self.text.find(needle)
            while i != -1:
                at.append(i)
                i = self.text.find(needle, i + 1)
            self._at[needle] = at
        return at

    def find(self, needle: str, start: int = 0) -> int:
        """What ``text.find(needle, start)`` returns (``start`` >= 0)."""
        at = self.all(needle)
        k = bisect_left(at, start)
        return at[k] if k < len(at) else -1

    def first_of(self, needles, start: int, end: int | None = None) -> tuple[int, int]:
        """(start, end) of the first occurrence of any of ``needles`` (longest first at a tie) at or after
        ``start`` and starting before ``end``; (-1, -1) if none."""
        best = (-1, -1)
        for n in needles:
            i = self.find(n, start)
            if i != -1 and (end is None or i < end) and (best[0] == -1 or i < best[0]):
                best = (i, i + len(n))
        return best


# --------------------------------------------------------------------------------------------
# Tool content: render once, know where each tool message's text landed (found by tokens/template/tool_content.py)


def _tool_pieces(content: str, warnings: list[str]) -> list[tuple[int, str]]:
    """A tool message's rendered text as (role code, text) pieces: the output, then each warning."""
    pieces = [(Role.ENV_OUTPUT.code, content)]
    for w in warnings:
        pieces += [(Role.CONTEXT.code, WARNING_SEPARATOR), (Role.WARNING.code, w)]
    return pieces


def _render_tools(
    tokenizer, info: TemplateInfo, messages: list[dict], n_prompt: int, tools, contents: dict[int, str], probe: str
) -> tuple[str, str, dict[int, int]]:
    """(real render, probe render, where each probe is in it): the conversation with each tool message's
    text, and with a probe in its place. The real one is spliced from the probe render once that was checked
    against a real render for this tokenizer (only templates that insert tool content independently of it)."""

    def with_content(fill) -> list[dict]:
        return [
            ({**m, "content": fill(k - n_prompt)} if k - n_prompt in contents else m) for k, m in enumerate(messages)
        ]

    probe_text = render(tokenizer, with_content(probe.format), tools)
    at = probe_positions(probe_text, probe, contents)
    state = tokenizer_state(tokenizer)
    key = bool(tools)
    if info.tool_content and state.splice_ok.get(key):
        return splice(probe_text, probe, contents, info.tool_content), probe_text, at
    text = render(tokenizer, with_content(contents.__getitem__), tools)
    if info.tool_content and key not in state.splice_ok:
        state.splice_ok[key] = splice(probe_text, probe, contents, info.tool_content) == text
    return text, probe_text, at


# --------------------------------------------------------------------------------------------
# Character roles


@dataclass
class Layout:
    text: str
    char_roles: np.ndarray  # int8 per character
    completion_start: int  # char where the first action begins
    message_ends: list[int]  # per completion message: char after its turn's end
    preamble_end: int  # end of the first end-of-turn token before the completion (0 if none)
    #: Char spans of the special tokens the template itself rendered, when the conversation also holds
    #: special-token text (which must stay text); None when it holds none (the text is tokenized whole).
    template_specials: list[tuple[int, int]] | None = None
    neutral_text: str = ""  # ``text`` with that special-token text replaced (same length), when it has some
    completion: list[dict] = field(default_factory=list)  # the completion messages as rendered (shaped)
    prompt: list[dict] = field(default_factory=list)  # the prompt messages as rendered (shaped)
    warnings: list[list[str]] = field(default_factory=list)  # per completion message
    actions: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # message -> (start, end, after)
    tool_forms: dict[int, str] = field(default_factory=dict)  # tool message -> how its content was rendered
    info: TemplateInfo | None = None


def _value_forms(value: Any) -> list[str]:
    """How a template may render one argument value."""
    if isinstance(value, str):  # as is, JSON-escaped, quotes backslash-escaped (Python-style calls)
        return (
            list(dict.fromkeys([value, escaped(value), value.replace("\\", "\\\\").replace("'", "\\'")]))
            if value
            else []
        )
    try:
        dumped = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return [str(value)]
    return list(dict.fromkeys([dumped, str(value), json.dumps(value)]))


def payload_pieces(message: dict) -> list[tuple[list[str], bool]]:
    """The text an assistant message contributes, in render order: (forms, required) per piece: its content,
    then per tool call its name and each argument value (or its arguments text, when given as text)."""
    pieces: list[tuple[list[str], bool]] = []
    content = message.get("content")
    if isinstance(content, str) and content.strip():
        pieces.append(([content.strip(), escaped(content.strip())], False))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        pieces.append(([fn["name"]], True))
        args = fn.get("arguments")
        if isinstance(args, str):
            pieces.append(([args, escaped(args)], False))
        elif isinstance(args, dict):
            pieces += [(_value_forms(v), False) for v in args.values() if _value_forms(v)]
    return pieces


def _payload_span(
    occ: Occurrences, message: dict, i: int, start: int, end: int, none_only: bool = False
) -> tuple[int, int]:
    """(first, last) character of assistant message ``i``'s payload in ``[start, end)``, searched in render
    order; an error when a tool call's name is not there (``none_only``: the template shows calls only for
    a message whose content is None, so a message with text and calls loses its calls)."""
    first, pos = -1, start
    for forms, required in payload_pieces(message):
        hits = [(at, at + len(f)) for f in forms if f and (at := occ.find(f, pos)) != -1 and at + len(f) <= end]
        if not hits:
            if required and none_only and (message.get("content") or "").strip():
                raise TemplateError(
                    "chat template renders tool calls only for an assistant message whose content is None; "
                    f"completion message {i} has both text and tool_calls, so its call {forms[0]!r} is not shown"
                )
            if required:
                raise TemplateError(
                    "chat template does not render assistant tool_calls (no tool-calling support?): "
                    f"{forms[0]!r} missing from completion message {i}"
                )
            continue
        at, pos = min(hits)
        first = at if first == -1 else first
    return (first if first != -1 else start), pos


def _action_span(
    occ: Occurrences, info: TemplateInfo, message: dict, i: int, after: str, anchor: int, limit: int, last: bool
) -> tuple[int, int]:
    """(start, end) of assistant message ``i``'s action: from where its prompt ends (the template's key for
    the kind of message before it, searched from ``anchor``, the end of that message's content) through the
    end-of-turn token after its last payload; ``limit`` is where the next message's content starts."""
    shape = CALL if message.get("tool_calls") else PLAIN
    which = (after, shape) if (after, shape) in info.keys else (after, CALL)
    key = info.keys[which]
    if info.key_has_special[which]:
        at = occ.find(key, anchor)
        if at == -1 or at >= limit:
            raise TemplateError(f"cannot find where the model's turn begins for completion message {i}")
        start = at + len(key)
    elif occ.text.startswith(key, anchor):
        start = anchor + len(key)
    else:
        raise TemplateError(f"cannot find where the model's turn begins for completion message {i}")
    _, payload_end = _payload_span(occ, message, i, start, limit, info.style.none_content)
    at, end = occ.first_of(info.stops, payload_end, limit)
    if at == -1:
        if not last:
            raise TemplateError(f"cannot find the end-of-turn token of completion message {i}")
        return start, limit  # a final turn the template leaves open
    # The turn ends at the last end-of-turn token of the special tokens that directly follow its first one.
    pos = end
    while True:
        nxt = next((s for s in info.special_tokens if occ.text.startswith(s, pos)), None)
        if nxt is None or pos + len(nxt) > limit:
            break
        pos += len(nxt)
        if nxt in info.stops:
            end = pos
    return start, end


def _mark_tool(roles: np.ndarray, pieces: list[tuple[int, str]], start: tuple[int, str]) -> int:
    """Mark a tool message's output and warnings where the template put them; where its text ends."""
    pos, mode = start
    full = "".join(p for _, p in pieces)
    if mode == "stripped":
        lead, kept = len(full) - len(full.lstrip()), len(full.strip())
        offset = 0
        for code, piece in pieces:
            a, b = max(offset, lead), min(offset + len(piece), lead + kept)
            if b > a:
                roles[pos + a - lead : pos + b - lead] = code
            offset += len(piece)
        return pos + kept
    for code, piece in pieces:
        n = len(content_form(piece, mode))
        roles[pos : pos + n] = code
        pos += n
    return pos


def _prompt_end(occ: Occurrences, prompt: list[dict]) -> int:
    """End of the last prompt message's content in the text (after the system prompt's), or 0 if not found."""
    pos = 0
    for m in prompt:
        content = m.get("content")
        if isinstance(content, str) and content.strip():
            at = occ.find(content.strip(), pos)
            if at != -1:
                pos = at + len(content.strip())
    return pos


def layout(tokenizer, trajectory: Trajectory) -> Layout:
    """Render ``trajectory`` and give every character of the rendered text a role."""
    tools = trajectory.tools or None
    info = template_info(tokenizer, tools)
    messages = adapt_messages([*trajectory.prompt, *trajectory.completion], info.style)
    n_prompt = len(trajectory.prompt)
    prompt, completion = messages[:n_prompt], messages[n_prompt:]
    pieces = {
        i: _tool_pieces(m.get("content") or "", trajectory.warnings[i])
        for i, m in enumerate(completion)
        if m["role"] == "tool"
    }
    contents = {i: "".join(p for _, p in pieces[i]) for i in pieces}
    data = json.dumps([messages, trajectory.tools, trajectory.warnings], ensure_ascii=False, default=str)
    if pieces:
        probe = probe_format(data)
        text, probe_text, probe_at = _render_tools(tokenizer, info, messages, n_prompt, tools, contents, probe)
        starts = content_starts(info, text, probe_text, probe, probe_at, contents)
    else:
        text, starts = render(tokenizer, messages, tools), {}
    result = Layout(text, np.zeros(len(text), dtype=np.int8), len(text), [], 0, prompt=prompt, completion=completion)
    result.info, result.warnings = info, trajectory.warnings
    if any(s in data for s in info.special_tokens):
        shown = [
            ({**m, "content": contents[k - n_prompt]} if k - n_prompt in contents else m)
            for k, m in enumerate(messages)
        ]
        result.template_specials, result.neutral_text = template_specials(tokenizer, info, shown, tools, text)
    occ = Occurrences(result.neutral_text or text)
    if result.neutral_text:  # search the conversation's own text as it stands in the neutral text
        prompt, completion_search = (
            neutralized(prompt, info.special_tokens),
            neutralized(completion, info.special_tokens),
        )
    else:
        completion_search = completion
    roles = result.char_roles
    content_ends = {i: _mark_tool(roles, pieces[i], starts[i]) for i in starts}
    result.tool_forms = {i: mode for i, (_, mode) in starts.items()}
    next_content, limit = [len(text)] * len(completion), len(text)
    for i in range(len(completion) - 1, -1, -1):
        next_content[i] = limit
        limit = starts[i][0] if i in starts else limit
    anchor, after = _prompt_end(occ, prompt), AFTER_USER
    for i, m in enumerate(completion_search):
        if m["role"] == "assistant":
            last = i == len(completion) - 1
            start, end = _action_span(occ, info, m, i, after, anchor, next_content[i], last)
            roles[start:end] = Role.ACTION.code
            result.actions[i] = (start, end, after)
            anchor, after = end, AFTER_USER
        elif i in starts:
            anchor, after = content_ends[i], AFTER_TOOL
        else:  # other roles in a completion (e.g. a user follow-up) are context
            content = (m.get("content") or "").strip()
            at = occ.find(content, anchor) if content else -1
            anchor, after = (at + len(content) if at != -1 and at < next_content[i] else anchor), AFTER_USER
    _finish(result, occ, starts, content_ends)
    return result


def _generation_prompt_before(text: str, end: int, prompt: str) -> int:
    """How many characters before ``end`` are the generation prompt (or, where the turn diverges from it
    inside, the part of it the turn shares): the next assistant's header, not the tool message's wrapper."""
    for m in range(min(len(prompt), end), 0, -1):
        if text.startswith(prompt[:m], end - m):
            return m
    return 0


def _finish(
    result: Layout, occ: Occurrences, starts: dict[int, tuple[int, str]], content_ends: dict[int, int]
) -> None:
    """Observation spans, message ends, where the completion starts and the preamble ends."""
    text, roles, info = result.text, result.char_roles, result.info
    spans = sorted((s, e) for s, e, _ in result.actions.values())
    action_starts = [s for s, _ in spans]
    if spans:
        result.completion_start = spans[0][0]
    for i in starts:  # the template's wrapper around a tool message: between the actions around it
        k = bisect_left(action_starts, starts[i][0])
        lo = spans[k - 1][1] if k else result.completion_start
        hi = action_starts[k] if k < len(spans) else len(text)
        hi -= _generation_prompt_before(text, hi, info.generation_prompts[AFTER_TOOL])
        window = roles[lo:hi]
        window[window == Role.CONTEXT.code] = Role.OBSERVATION.code
    roles[: result.completion_start][roles[: result.completion_start] == Role.OBSERVATION.code] = Role.CONTEXT.code
    ends, last = [], result.completion_start
    for i in range(len(result.completion)):
        if i in result.actions:
            end = result.actions[i][1]
        else:  # a tool or other message ends after the first end-of-turn (else added) token past its content
            base = content_ends.get(i, last)
            k = bisect_left(action_starts, base)
            limit = action_starts[k] if k < len(action_starts) else len(text)
            at, end = occ.first_of(info.stops, base, limit)
            if at == -1:
                at, end = occ.first_of(info.added_tokens, base, limit)
            end = end if at != -1 else limit
        last = max(last, end)
        ends.append(last)
    result.message_ends = ends
    at, end = occ.first_of(info.stops, 0, result.completion_start)
    result.preamble_end = end if at != -1 and end <= result.completion_start else 0
