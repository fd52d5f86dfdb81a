"""Render a trajectory with the model's chat template and give every character a role.

Template facts (generation prompt, end-of-turn markers, how tool content is inserted) are derived
once per tokenizer from tiny probe conversations and kept, with everything else derived per
tokenizer, in one :class:`TokenizerState` (see :func:`tokenizer_state`).

Roles come from character spans in the rendered text:

* ``env_output``: the characters of each tool message's content (where the template put them,
  found with a probe render, so a tool output that also appears in the scaffolding is never
  mistaken for it);
* ``warning``: harness warnings, rendered after the tool output inside the same tool message;
* ``action``: what the model generates for an assistant turn, from the end of the template's
  generation prompt to the end-of-turn token inclusive;
* ``observation``: the template's wrapper around tool messages (role headers,
  ``<tool_response>`` tags) up to the next generation prompt;
* ``context``: everything else (system prompt, tools, task, other scaffolding).
"""

from __future__ import annotations

import json
import re
import secrets
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TemplateError
from ..roles import Role, Trajectory, tool_call

#: How warnings are appended to a tool message's rendered text (never into its stored content).
WARNING_SEPARATOR = "\n\n"

#: Stands in for special-token text inside the conversation when locating the template's own special tokens.
_NEUTRAL = "\ue000"


def probe_format(*data: str) -> str:
    """A placeholder format (``.format(i)``) for locating rendered text: random, and absent from ``data``."""
    while True:
        tag = f"echoprobe{secrets.token_hex(8)}"
        if not any(tag in d for d in data):
            return tag + "_{}_"


@dataclass(frozen=True)
class TemplateInfo:
    generation_prompt: str  # what add_generation_prompt appends: the assistant turn header
    end_markers: tuple[str, ...]  # tokens that end a generated turn
    tool_content: str | None  # "verbatim" | "escaped" when tool content is inserted as-is, else None
    special_tokens: tuple[str, ...] = ()  # the tokenizer's special tokens, longest first


@dataclass
class TokenizerState:
    """Everything derived once per tokenizer: template facts, whether splicing tool text into a probe
    render reproduces the real render (checked once), and the preamble-caching encoder."""

    tokenizer: Any
    template_key: str | None = None  # the chat template ``info`` and ``splice_ok`` were derived from
    info: TemplateInfo | None = None
    splice_ok: bool | None = None  # None: not checked yet
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
        state.template_key, state.info, state.splice_ok = key, None, None
    return state


def _render(tokenizer, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as exc:  # jinja raises many types; all mean "this template cannot render this"
        raise TemplateError(f"chat template failed to render the conversation: {exc}") from exc


def template_info(tokenizer) -> TemplateInfo:
    """Generation prompt and end-of-turn markers of ``tokenizer``'s chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise TemplateError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; ECHO renders each "
            "trajectory with the model's own template (set tokenizer.chat_template)"
        )
    state = tokenizer_state(tokenizer)
    if state.info is None:
        state.info = _derive_template_info(tokenizer)
    return state.info


def _derive_template_info(tokenizer) -> TemplateInfo:
    convo = [{"role": "user", "content": "x"}]
    plain = _render(tokenizer, convo, None)
    with_gen = _render(tokenizer, convo, None, add_generation_prompt=True)
    if not with_gen.startswith(plain) or len(with_gen) == len(plain):
        raise TemplateError("chat template has no generation prompt (add_generation_prompt changes nothing)")
    probe = probe_format().format("A")
    text = _render(
        tokenizer, [*convo, {"role": "assistant", "content": probe}, {"role": "user", "content": "y"}], None
    )
    after = text[text.index(probe) + len(probe) :]
    specials = sorted(
        {*tokenizer.all_special_tokens, *(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)},
        key=len,
        reverse=True,
    )
    markers = {s for s in specials if after.startswith(s)}
    if tokenizer.eos_token:
        markers.add(tokenizer.eos_token)
    if not markers:
        raise TemplateError("cannot find the end-of-turn token of the chat template's assistant turns")
    return TemplateInfo(
        with_gen[len(plain) :],
        tuple(sorted(markers, key=len, reverse=True)),
        _tool_content_mode(tokenizer),
        tuple(specials),
    )


def _tool_content_mode(tokenizer) -> str | None:
    """How the template inserts tool content, if it does so independently of the value.

    Two unlike contents are rendered; if both come out verbatim (or both JSON-escaped), a tool
    message's text can be spliced into a probe render instead of rendering twice.
    """
    modes = set()
    for content in (' A"b\n\\c\t ', '\n{"k": "v"}\n'):  # unlike, and both change when escaped
        convo = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": [tool_call("f", {})]},
            {"role": "tool", "name": "f", "content": content},
        ]
        try:
            text = _render(tokenizer, convo, None)
        except TemplateError:
            return None
        modes.add("verbatim" if content in text else "escaped" if _escaped(content) in text else None)
    return modes.pop() if len(modes) == 1 else None


def _escaped(s: str) -> str:
    """``s`` as a chat template's ``tojson`` renders it, without the quotes."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


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


def _find_end(text: Occurrences, start: int, markers: tuple[str, ...]) -> int:
    """End (exclusive) of the first end-of-turn marker at or after ``start``; len(text) if none."""
    best = -1
    best_end = len(text.text)
    for m in markers:
        i = text.find(m, start)
        if i != -1 and (best == -1 or i < best):
            best, best_end = i, i + len(m)
    return best_end


# --------------------------------------------------------------------------------------------
# Tool content: render once, know where each tool message's text landed


def _tool_pieces(content: str, warnings: list[str]) -> list[tuple[int, str]]:
    """A tool message's rendered text as (role code, text) pieces: the output, then each warning."""
    pieces = [(Role.ENV_OUTPUT.code, content)]
    for w in warnings:
        pieces += [(Role.CONTEXT.code, WARNING_SEPARATOR), (Role.WARNING.code, w)]
    return pieces


def _splice(probe_text: str, probe: str, contents: dict[int, str], mode: str) -> str:
    """The probe render with each probe replaced by its tool content as the template renders it."""
    out, last = [], 0
    for i in sorted(contents):
        probe_i = probe.format(i)
        at = probe_text.find(probe_i, last)
        out += [probe_text[last:at], _escaped(contents[i]) if mode == "escaped" else contents[i]]
        last = at + len(probe_i)
    out.append(probe_text[last:])
    return "".join(out)


def _render_tools(
    tokenizer, info: TemplateInfo, trajectory: Trajectory, contents: dict[int, str], probe: str
) -> tuple[str, str, dict[int, int]]:
    """(real render, probe render, where each probe is in it): the conversation with each tool message's
    text, and with a probe in its place. The real one is spliced from the probe render once that was checked
    against a real render for this tokenizer (only templates that insert tool content as-is)."""
    prompt, completion, tools = trajectory.prompt, trajectory.completion, trajectory.tools or None
    probed = [
        *prompt,
        *[({**m, "content": probe.format(i)} if i in contents else m) for i, m in enumerate(completion)],
    ]
    probe_text = _render(tokenizer, probed, tools)
    at = _probe_positions(probe_text, probe, contents)
    state = tokenizer_state(tokenizer)
    if info.tool_content and state.splice_ok:
        return _splice(probe_text, probe, contents, info.tool_content), probe_text, at
    real = [*prompt, *[({**m, "content": contents[i]} if i in contents else m) for i, m in enumerate(completion)]]
    text = _render(tokenizer, real, tools)
    if info.tool_content and state.splice_ok is None:
        state.splice_ok = _splice(probe_text, probe, contents, info.tool_content) == text
    return text, probe_text, at


_DIGITS = re.compile(r"(\d+)_")


def _probe_positions(probe_text: str, probe: str, contents: dict[int, str]) -> dict[int, int]:
    """Where ``probe.format(i)`` is in ``probe_text`` for each tool message ``i``, found in one pass (a search
    from the start per message was quadratic); an error unless each occurs exactly once."""
    head = probe[: probe.index("{}")]  # the random tag and "_": then the index and "_"
    found: dict[str, list[int]] = {}
    for at in Occurrences(probe_text).all(head):
        m = _DIGITS.match(probe_text, at + len(head))
        if m:
            found.setdefault(m.group(1), []).append(at)
    positions = {i: found.get(str(i), []) for i in contents}
    if any(len(at) != 1 for at in positions.values()):
        raise TemplateError("chat template does not render each tool message's content exactly once")
    return {i: at[0] for i, at in positions.items()}


def _content_starts(
    info: TemplateInfo, text: str, probe_text: str, probe: str, probe_at: dict[int, int], contents: dict[int, str]
) -> dict[int, tuple[int, bool]]:
    """Where each tool message's text starts in ``text``, and whether the template JSON-escaped it."""
    starts: dict[int, tuple[int, bool]] = {}
    shift = 0
    for i in sorted(contents):
        probe_i = probe.format(i)
        pos = probe_at[i] + shift
        full = contents[i]
        # A prefix test alone is ambiguous ("\\" is a prefix of its own escaped form "\\\\"):
        # trust the template's known mode, else prefer the escaped form when it differs.
        forms = {"verbatim": [False], "escaped": [True]}.get(info.tool_content, [True, False])
        matches = [esc for esc in forms if text.startswith(_escaped(full) if esc else full, pos)]
        if not matches:
            raise TemplateError(
                f"chat template alters the text of tool message {i} (neither verbatim nor JSON-escaped)"
            )
        starts[i] = (pos, matches[0])
        shift += len(_escaped(full) if matches[0] else full) - len(probe_i)
    if len(probe_text) + shift != len(text):
        raise TemplateError("chat template renders tool output in a content-dependent way; cannot align roles")
    return starts


# --------------------------------------------------------------------------------------------
# Character roles


@dataclass
class Layout:
    text: str
    char_roles: np.ndarray  # int8 per character
    completion_start: int  # char where the first action begins
    message_ends: list[int]  # per completion message: char after its turn's end marker
    preamble_end: int  # end of the first turn (system + tools) when it ends in an end-of-turn token, else 0
    #: Char spans of the special tokens the template itself rendered, when the conversation also holds
    #: special-token text (which must stay text); None when it holds none (the text is tokenized whole).
    template_specials: list[tuple[int, int]] | None = None
    neutral_text: str = ""  # ``text`` with that special-token text replaced (same length), when it has some


def _mark_action(
    occ: Occurrences, roles: np.ndarray, info: TemplateInfo, message: dict, i: int, cursor: int
) -> tuple[int, int]:
    """Mark assistant message ``i``'s generated characters; (where they start, where its turn ends)."""
    text = occ.text
    head = occ.find(info.generation_prompt, cursor)
    if head == -1:
        raise TemplateError(f"cannot find the assistant turn of completion message {i} in the rendered text")
    start = head + len(info.generation_prompt)
    end = _find_end(occ, start, info.end_markers)
    for call in message.get("tool_calls") or []:
        if call["function"]["name"] not in text[start:end]:
            raise TemplateError(
                "chat template does not render assistant tool_calls (no tool-calling support?): "
                f"{call['function']['name']!r} missing from completion message {i}"
            )
    roles[start:end] = Role.ACTION.code
    return start, end


def _mark_tool(
    occ: Occurrences,
    roles: np.ndarray,
    info: TemplateInfo,
    pieces: list[tuple[int, str]],
    start: tuple[int, bool],
    cursor: int,
) -> int:
    """Mark a tool message's output and warnings, and its wrapper as observation; where its turn ends."""
    pos, escaped = start
    for code, piece in pieces:
        n = len(_escaped(piece) if escaped else piece)
        roles[pos : pos + n] = code
        pos += n
    nxt = occ.find(info.generation_prompt, pos)
    window = roles[cursor : len(occ.text) if nxt == -1 else nxt]
    window[window == Role.CONTEXT.code] = Role.OBSERVATION.code
    return _find_end(occ, pos, info.end_markers)


def _neutralized(value, specials: tuple[str, ...]):
    """``value`` (strings, lists, dicts) with each special token's text replaced by as many neutral characters."""
    if isinstance(value, str):
        for s in specials:
            value = value.replace(s, _NEUTRAL * len(s))
        return value
    if isinstance(value, dict):
        return {k: _neutralized(v, specials) for k, v in value.items()}
    if isinstance(value, list):
        return [_neutralized(v, specials) for v in value]
    return value


def _template_specials(
    tokenizer, info: TemplateInfo, trajectory: Trajectory, contents: dict[int, str], text: str
) -> tuple[list[tuple[int, int]], str]:
    """Where the template itself put special tokens in ``text``, found in a render of the same conversation
    whose special-token text is neutralized (same length; a template inserts it verbatim or JSON-escaped,
    and JSON escapes neither)."""
    real = [
        *trajectory.prompt,
        *[({**m, "content": contents[i]} if i in contents else m) for i, m in enumerate(trajectory.completion)],
    ]
    neutral = _render(
        tokenizer, _neutralized(real, info.special_tokens), _neutralized(trajectory.tools, info.special_tokens) or None
    )
    if len(neutral) != len(text):
        raise TemplateError(
            "chat template renders special-token text inside the conversation in a "
            "length-changing way; cannot tell it from the template's own special tokens"
        )
    spans, taken = [], np.zeros(len(neutral) + 1, dtype=bool)
    for s in info.special_tokens:  # longest first
        at = neutral.find(s)
        while at != -1:
            if not taken[at : at + len(s)].any():
                spans.append((at, at + len(s)))
                taken[at : at + len(s)] = True
            at = neutral.find(s, at + len(s))
    return sorted(spans), neutral


def layout(tokenizer, trajectory: Trajectory) -> Layout:
    """Render ``trajectory`` and give every character of the rendered text a role."""
    info = template_info(tokenizer)
    completion = trajectory.completion
    pieces = {
        i: _tool_pieces(m.get("content") or "", trajectory.warnings[i])
        for i, m in enumerate(completion)
        if m["role"] == "tool"
    }
    contents = {i: "".join(p for _, p in pieces[i]) for i in pieces}
    data = json.dumps(
        [trajectory.prompt, completion, trajectory.tools, trajectory.warnings], ensure_ascii=False, default=str
    )
    if pieces:
        probe = probe_format(data)
        text, probe_text, probe_at = _render_tools(tokenizer, info, trajectory, contents, probe)
        starts = _content_starts(info, text, probe_text, probe, probe_at, contents)
    else:
        text, starts = _render(tokenizer, [*trajectory.prompt, *completion], trajectory.tools or None), {}
    roles = np.zeros(len(text), dtype=np.int8)
    occ = Occurrences(text)
    cursor, completion_start, ends = 0, None, []
    for i, m in enumerate(completion):
        if m["role"] == "assistant":
            start, cursor = _mark_action(occ, roles, info, m, i, cursor)
            completion_start = start if completion_start is None else completion_start
        elif i in starts:
            cursor = _mark_tool(occ, roles, info, pieces[i], starts[i], cursor)
        else:  # other roles in a completion (e.g. a user follow-up) are context; skip their turn
            cursor = _find_end(occ, cursor, info.end_markers)
        ends.append(cursor)
    if completion_start is None:
        completion_start = len(text)
    # Everything before the first action is the prompt, including the generation prompt.
    roles[:completion_start][roles[:completion_start] == Role.OBSERVATION.code] = Role.CONTEXT.code
    first_end = _find_end(occ, 0, info.end_markers)
    result = Layout(text, roles, completion_start, ends, first_end if first_end < completion_start else 0)
    if any(s in data for s in info.special_tokens):
        result.template_specials, result.neutral_text = _template_specials(tokenizer, info, trajectory, contents, text)
    return result
