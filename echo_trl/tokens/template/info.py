"""What a chat template does with a tool conversation, found once per tokenizer from probe renders.

Chat templates differ in every detail that decides roles: whether ``add_generation_prompt`` adds an
assistant header (and whether it honours the flag at all), which token ends an assistant turn that
calls a tool (``<|im_end|>``, ``<|call|>``, ``<|observation|>``, ``<｜tool▁call▁end｜>`` ...), whether
tool-call arguments must be a dict or JSON text, whether tool calls need ids, how tool output is
inserted. None of it is hard-coded here: a short probe conversation (the real tool schemas, two tool
calls with their results and a final answer, every variable part a unique placeholder) is rendered a
few ways, and the facts are read off the renders.

The facts (:class:`TemplateInfo`):

* ``style``: how messages must be shaped for the template to render tool calls (:class:`MessageStyle`);
* ``keys``: per kind of message before an assistant turn (``user``, ``tool``), the text that ends what the
  model is shown before it generates: the rendered conversation up to that message *with*
  ``add_generation_prompt``, compared with the full conversation, agrees up to a point; the key is the
  agreed text from its last special token on (or all of it when it has none);
* ``generation_prompts``: what ``add_generation_prompt`` itself appends after each kind of message;
* ``stops``: the tokens that end an assistant turn: after a turn's last payload, the text it renders when
  it is the last message and when a message follows agree on a tail; the end is the tokenizer's EOS in
  that tail, else its last special token, else (a turn the template leaves open, closed by the next
  message's first special token, as GLM's ``<|observation|>``) that next special token;
* ``tool_content``: how tool content is inserted (verbatim, JSON-escaped, stripped), when it is
  independent of the value.

A template that cannot render a tool conversation is refused with one line saying what it lacks.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from ...errors import TemplateError

#: Stand-in for special-token text inside the conversation when locating the template's own special tokens.
NEUTRAL = "\ue000"

#: Kinds of message an assistant turn can follow, and shapes of the turn (calls tools or answers in text).
AFTER_USER, AFTER_TOOL = "user", "tool"
CALL, PLAIN = "call", "plain"


@dataclass(frozen=True)
class MessageStyle:
    """How messages are shaped before rendering, so that the template renders their tool calls.

    Probed in order (the first that renders every call, argument and tool output wins): arguments as a
    dict (the documented format) or as JSON text (templates that concatenate strings); empty content of
    a tool-call message as ``""`` or as ``None`` (templates that render calls only when content is none);
    tool-call ids kept as recorded, and generated when absent (nine digits, the strictest form templates
    demand) only where the template requires ids.
    """

    json_arguments: bool = False
    none_content: bool = False
    call_ids: bool = False


STYLES = tuple(
    MessageStyle(json_arguments=a, none_content=c, call_ids=i)
    for i in (False, True)
    for c in (False, True)
    for a in (False, True)
)


def _arguments(value: Any, as_json: bool) -> Any:
    if as_json:
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def adapt_messages(messages: list[dict], style: MessageStyle) -> list[dict]:
    """``messages`` shaped for the template (copies; the inputs are not changed)."""
    out, pending, serial = [], [], 0
    for m in messages:
        m = dict(m)
        calls = m.get("tool_calls")
        if m.get("role") == "assistant" and calls:
            if not m.get("content"):
                m["content"] = None if style.none_content else ""
            new_calls = []
            for c in calls:
                c = {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": _arguments(c["function"].get("arguments"), style.json_arguments),
                    },
                }
                serial += 1
                if style.call_ids and not c.get("id"):
                    c["id"] = f"{serial:09d}"
                new_calls.append(c)
            m["tool_calls"] = new_calls
            pending = [c.get("id") for c in new_calls]
        elif m.get("role") == "tool":
            call_id = pending.pop(0) if pending else None
            if call_id and not m.get("tool_call_id"):
                m["tool_call_id"] = call_id
        else:
            pending = []
            if m.get("content") is None:
                m["content"] = ""
        out.append(m)
    return out


def render(tokenizer, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = False) -> str:
    """The template's render of ``messages``; any template failure is a :class:`TemplateError`.

    ``apply_chat_template`` drops every None-valued message field before rendering, so a template that renders
    tool calls only for ``content`` none (DeepSeek-R1-Distill: the OpenAI convention for a turn that only calls
    tools) could never show them. Messages carrying such a None are rendered by transformers' own renderer with
    everything ``apply_chat_template`` passes it (the template it picks for ``tools``, the special tokens), the
    None kept; all other messages go through ``apply_chat_template`` itself.
    """
    try:
        if any(m.get("content", "") is None and m.get("tool_calls") for m in messages):
            kept = [
                {k: v for k, v in m.items() if v is not None or (k == "content" and m.get("tool_calls"))}
                for m in messages
            ]  # only a tool-call turn's content None is kept; other None fields are dropped as transformers does
            rendered, _ = render_jinja_template(
                conversations=[kept],
                tools=tools or None,
                chat_template=tokenizer.get_chat_template(None, tools or None),
                add_generation_prompt=add_generation_prompt,
                **tokenizer.special_tokens_map,
            )
            return rendered[0]
        return tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as exc:  # jinja raises many types; all mean "this template cannot render this"
        raise TemplateError(f"chat template failed to render the conversation: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def escaped(s: str) -> str:
    """``s`` as a chat template's ``tojson`` renders it, without the quotes."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


def common_prefix(a: str, b: str, tokens: tuple[str, ...] = ()) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, cut back so that it does not end inside one of
    ``tokens`` in either string (``<|end|>`` and ``<|return|>`` share ``<|``, which is no agreement)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    moved = bool(tokens)
    while moved:
        moved = False
        for t in tokens:
            for text in (a, b):
                at = text.rfind(t, max(0, i - len(t) + 1), i + len(t) - 1)
                if at != -1 and at < i < at + len(t):
                    i, moved = at, True
    return i


@dataclass(frozen=True)
class TemplateInfo:
    style: MessageStyle
    keys: dict[tuple[str, str], str]  # per (previous message kind, turn shape): the text that ends the prompt
    key_has_special: dict[tuple[str, str], bool]  # False: the key is found right at the previous message's end
    generation_prompts: dict[str, str]  # per kind of previous message: what add_generation_prompt appends
    stops: tuple[str, ...]  # tokens that end an assistant turn, longest first
    tool_content: str | None  # "verbatim" | "escaped" | "stripped" when independent of the value, else None
    special_tokens: tuple[str, ...] = ()  # the tokenizer's special tokens, longest first
    added_tokens: tuple[str, ...] = ()  # every added token (special or not), longest first
    eos: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # probe renders, kept for error messages


def special_tokens(tokenizer) -> tuple[str, ...]:
    found = {*tokenizer.all_special_tokens, *(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)}
    return tuple(sorted((t for t in found if t), key=len, reverse=True))


def added_tokens(tokenizer) -> tuple[str, ...]:
    found = {*special_tokens(tokenizer), *(t.content for t in tokenizer.added_tokens_decoder.values())}
    return tuple(sorted((t for t in found if t), key=len, reverse=True))


def last_special(text: str, specials: tuple[str, ...]) -> tuple[int, int] | None:
    """(start, end) of the special token that ends last in ``text`` (the rightmost one), or None."""
    best = None
    for s in specials:
        at = text.rfind(s)
        if at != -1 and (best is None or at + len(s) > best[1] or (at + len(s) == best[1] and at < best[0])):
            best = (at, at + len(s))
    return best


def first_special(text: str, specials: tuple[str, ...], start: int = 0) -> tuple[int, int] | None:
    """(start, end) of the first special token in ``text`` at or after ``start`` (the longest at a tie), or None."""
    best = None
    for s in specials:  # longest first: at a tie the longest wins
        at = text.find(s, start)
        if at != -1 and (best is None or at < best[0]):
            best = (at, at + len(s))
    return best


# --------------------------------------------------------------------------------------------
# Probe conversation


class _Probe:
    """The probe conversation: every variable part a unique placeholder."""

    def __init__(self, tools: list[dict] | None):
        self.tag = f"echoprobe{secrets.token_hex(6)}"
        names = [t.get("function", t).get("name") for t in tools or [] if isinstance(t, dict)]
        names = [n for n in names if isinstance(n, str) and n] or ["lookup", "update"]
        self.names = (names[0], names[1 % len(names)])
        self.system, self.user, self.user2 = self.p("system"), self.p("user"), self.p("user2")
        self.args = (self.p("arg1"), self.p("arg2"))
        self.outputs = (self.p("out1"), self.p("out2"))
        self.final, self.reply = self.p("final"), self.p("reply")

    def p(self, label: str) -> str:
        return f"{self.tag}_{label}_"

    def prompt(self) -> list[dict]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]

    def call(self, k: int, style: MessageStyle) -> dict:
        c = {"type": "function", "function": {"name": self.names[k], "arguments": {"q": self.args[k]}}}
        return adapt_messages([{"role": "assistant", "content": "", "tool_calls": [c]}], style)[0]

    def conversation(self, style: MessageStyle) -> list[dict]:
        """prompt, call, result, call, result, final answer."""
        msgs = [
            *self.prompt(),
            {"role": "assistant", "content": "", "tool_calls": [self.call(0, style)["tool_calls"][0]]},
            {"role": "tool", "name": self.names[0], "content": self.outputs[0]},
            {"role": "assistant", "content": "", "tool_calls": [self.call(1, style)["tool_calls"][0]]},
            {"role": "tool", "name": self.names[1], "content": self.outputs[1]},
            {"role": "assistant", "content": self.final},
        ]
        return adapt_messages(msgs, style)


def _choose_style(tokenizer, probe: _Probe, tools) -> tuple[MessageStyle, str]:
    """The first style under which the probe conversation renders every call, argument and output."""
    failures: list[str] = []
    none_failure = ""
    dropped_calls = dropped_tools = False
    for style in STYLES:
        try:
            text = render(tokenizer, probe.conversation(style), tools)
        except TemplateError as exc:
            failures.append(str(exc))
            none_failure = none_failure or (str(exc) if style.none_content else "")
            continue
        calls_shown = all(a in text for a in probe.args)  # the argument placeholders appear only in the calls
        outputs_shown = all(o in text for o in probe.outputs)
        if calls_shown and outputs_shown:
            return style, text
        dropped_calls |= not calls_shown
        dropped_tools |= not outputs_shown
    if dropped_calls:
        why = (
            "; with content None it fails "
            f"({none_failure.removeprefix('chat template failed to render the conversation: ')})"
            if none_failure and "tool_calls" in str(tokenizer.chat_template)
            else "; the template never reads tool_calls"
            if "tool_calls" not in str(tokenizer.chat_template)
            else ""
        )
        raise TemplateError(
            "chat template renders no assistant tool_calls (an assistant turn's calls are missing from its render"
            f"{why}), so a tool-calling trajectory cannot be shown to this model"
        )
    if dropped_tools:
        raise TemplateError("chat template renders no tool messages (tool output is missing from its render)")
    reason = failures[0].removeprefix("chat template failed to render the conversation: ")
    if not tools:
        schema = {"type": "function", "function": {"name": probe.names[0], "description": "", "parameters": {}}}
        try:
            render(tokenizer, probe.conversation(STYLES[0]), [schema])
        except TemplateError:
            pass
        else:
            raise TemplateError(
                "chat template needs tool schemas (tools) to render a conversation, and these rows render "
                f"without them ({reason})"
            )
    plain = [*probe.prompt(), {"role": "assistant", "content": probe.reply}]
    try:
        render(tokenizer, plain, tools)
    except TemplateError as exc:
        raise TemplateError(f"chat template cannot render a user/assistant exchange: {exc}") from None
    raise TemplateError(
        f"chat template has no tool role: it cannot render a tool message after an assistant tool call ({reason})"
    )


def _key(prompt_text: str, prompt_at: int, full: str, full_at: int, gen: str, specials, added) -> tuple[str, bool]:
    """The text that ends the model's prompt after a message whose content ends at ``prompt_at`` in the render
    with the generation prompt ``gen`` (``prompt_text``) and at ``full_at`` in the full render: where the
    turn's header starts like the generation prompt, as much of it as the turn agrees with; otherwise the
    text both renders agree on after that content (templates without a generation prompt there)."""
    span = first_special(gen, specials)
    head = gen[: span[1]] if span else gen
    at = full.find(head, full_at) if head else -1
    if at != -1:
        return gen[: common_prefix(gen, full[at:], added)], span is not None
    agreed = prompt_text[prompt_at : prompt_at + common_prefix(prompt_text[prompt_at:], full[full_at:], added)]
    span = last_special(agreed, specials)
    return (agreed[span[0] :], True) if span else (agreed, False)


def _generation_prompt(tokenizer, messages, tools) -> str:
    with_gen = render(tokenizer, messages, tools, add_generation_prompt=True)
    without = render(tokenizer, messages, tools)
    return with_gen[common_prefix(with_gen, without) :]


def _stop(own: str, own_at: int, nxt: str, nxt_at: int, info_specials, eos, until: str | None) -> str | None:  # noqa: PLR0913
    """The token that ends an assistant turn whose last payload ends at ``own_at`` in its render as the last
    message (``own``) and at ``nxt_at`` in a render where a message follows (``nxt``)."""
    tail = own[own_at : own_at + common_prefix(own[own_at:], nxt[nxt_at:], info_specials)]
    if eos and eos in tail:
        return eos
    span = last_special(tail, info_specials)
    if span:
        return tail[span[0] : span[1]]
    limit = nxt.find(until, nxt_at) if until else -1
    span = first_special(nxt, info_specials, nxt_at + len(tail))
    if span and (limit == -1 or span[0] < limit) and not nxt[nxt_at + len(tail) : span[0]].strip():
        return nxt[span[0] : span[1]]  # a turn the template leaves open, closed by the next message's first token
    return None


def _tool_content_mode(tokenizer, probe: _Probe, style: MessageStyle, tools) -> str | None:
    """How the template inserts tool content, when it does so independently of the value (two unlike
    contents both verbatim, both JSON-escaped or both stripped): then a tool message's text can be
    spliced into a probe render instead of rendering twice."""
    modes = set()
    for content in (' A"b\n\\c\t ', '\n{"k": "v"}\n'):  # unlike, and each changes when escaped or stripped
        convo = adapt_messages(
            [*probe.prompt(), probe.call(0, style), {"role": "tool", "name": probe.names[0], "content": content}],
            style,
        )
        try:
            text = render(tokenizer, convo, tools)
        except TemplateError:
            return None
        modes.add(
            "verbatim"
            if content in text
            else "escaped"
            if escaped(content) in text
            else "stripped"
            if content.strip() in text
            else None
        )
    return modes.pop() if len(modes) == 1 else None


def derive_template_info(tokenizer, tools: list[dict] | None) -> TemplateInfo:
    """Every :class:`TemplateInfo` fact of ``tokenizer``'s chat template, rendering with ``tools``."""
    specials = special_tokens(tokenizer)
    eos = tokenizer.eos_token or None
    probe = _Probe(tools)
    style, full = _choose_style(tokenizer, probe, tools)
    convo = probe.conversation(style)
    prompt, first_call, first_out = convo[:2], convo[:3], convo[:4]

    added = added_tokens(tokenizer)
    reply = [*prompt, {"role": "assistant", "content": probe.reply}]
    gens = {
        AFTER_USER: _generation_prompt(tokenizer, prompt, tools),
        AFTER_TOOL: _generation_prompt(tokenizer, first_out, tools),
    }
    keys, has_special = {}, {}
    cases = [  # (kind of previous message, shape of the turn, history, its last content, full render)
        (AFTER_USER, CALL, prompt, probe.user, full),
        (AFTER_TOOL, CALL, first_out, probe.outputs[0], full),
        (AFTER_TOOL, PLAIN, convo[:6], probe.outputs[1], full),
        (AFTER_USER, PLAIN, prompt, probe.user, None),
    ]
    for kind, shape, history, anchor, whole in cases:
        try:
            whole = whole if whole is not None else render(tokenizer, reply, tools)
        except TemplateError:
            continue  # a template that renders no plain reply after the task (tool-only chats)
        prompt_text = render(tokenizer, history, tools, add_generation_prompt=True)
        p_at, f_at = prompt_text.find(anchor), whole.find(anchor)
        if p_at == -1 or f_at == -1:
            raise TemplateError(
                f"chat template does not render the {kind} message's content verbatim; cannot align roles"
            )
        args = (prompt_text, p_at + len(anchor), whole, f_at + len(anchor), gens[kind], specials, added)
        keys[(kind, shape)], has_special[(kind, shape)] = _key(*args)

    stops = set()
    shapes = [  # (assistant turn last, followed by a message, payload that ends the turn, next message's payload)
        (first_call, first_out, probe.args[0], probe.outputs[0]),
        (convo[:5], convo[:6], probe.args[1], probe.outputs[1]),
    ]
    shapes.append((reply, [*reply, {"role": "user", "content": probe.user2}], probe.reply, probe.user2))
    for own_msgs, nxt_msgs, payload, until in shapes:
        try:
            own, nxt = render(tokenizer, own_msgs, tools), render(tokenizer, nxt_msgs, tools)
        except TemplateError:
            if payload == probe.reply:
                continue  # templates that reject a plain reply followed by a user turn (tool-only chats)
            raise
        o_at, n_at = own.rfind(payload), nxt.find(payload)
        if o_at == -1 or n_at == -1:
            continue
        stop = _stop(own, o_at + len(payload), nxt, n_at + len(payload), specials, eos, until)
        if stop is None:
            raise TemplateError("cannot find the token that ends the chat template's assistant turns")
        stops.add(stop)
    at = full.rfind(probe.final)
    final_stop = (
        _stop(full, at + len(probe.final), full, at + len(probe.final), specials, eos, None) if at != -1 else None
    )
    if final_stop:
        stops.add(final_stop)
    if eos:
        stops.add(eos)
    return TemplateInfo(
        style=style,
        keys=keys,
        key_has_special=has_special,
        generation_prompts=gens,
        stops=tuple(sorted(stops, key=len, reverse=True)),
        tool_content=_tool_content_mode(tokenizer, probe, style, tools),
        special_tokens=specials,
        added_tokens=added,
        eos=eos,
        facts={"probe": full},
    )
