"""Exact per-token roles: render once with the model's chat template, tokenize once.

The token ids are exactly ``tokenizer(rendered_text, add_special_tokens=False)`` of the whole
conversation rendered by the model's own chat template: tokenizing per segment would drift at
BPE merges across segment boundaries. Roles come from character spans in the rendered text:

* ``env_output``: the characters of each tool message's content (where the template put them,
  found with a probe render, so a tool output that also appears in the scaffolding is never
  mistaken for it);
* ``warning``: harness warnings, rendered after the tool output inside the same tool message;
* ``action``: what the model generates for an assistant turn, from the end of the template's
  generation prompt to the end-of-turn token inclusive;
* ``observation``: the template's wrapper around tool messages (role headers,
  ``<tool_response>`` tags) up to the next generation prompt;
* ``context``: everything else (system prompt, tools, task, other scaffolding).

A token takes the role of the span holding its first character (a BPE token that merges the
last character of a tool output with the newline after it counts as env output).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dataset import row_to_trajectory
from .errors import EchoTrlError, TemplateError
from .roles import WORLD_LOSS_TARGETS, Role, Trajectory, tool_call

#: Char/token role codes (also the values of :attr:`RoleTokens.roles`).
CONTEXT, ACTION, ENV_OUTPUT, WARNING, OBSERVATION = 0, 1, 2, 3, 4
ROLE_CODES = {Role.CONTEXT: CONTEXT, Role.ACTION: ACTION, Role.ENV_OUTPUT: ENV_OUTPUT, Role.WARNING: WARNING}

#: How warnings are appended to a tool message's rendered text (never into its stored content).
WARNING_SEPARATOR = "\n\n"

_PROBE = "ECHOPROBE{}X"


class TruncationError(EchoTrlError):
    """The prompt alone does not fit in ``max_length``: there is nothing left to train on."""


@dataclass
class RoleTokens:
    """Token ids of one trajectory with aligned, disjoint role masks."""

    input_ids: list[int]
    roles: np.ndarray  # int8 per token: CONTEXT / ACTION / ENV_OUTPUT / WARNING / OBSERVATION
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
                f"the prompt alone has {self.prompt_length} tokens, more than max_length={max_length}")
        keep = sum(1 for _, end in self.message_token_spans if end <= max_length)  # ends increase
        cut = self.message_token_spans[keep - 1][1] if keep else self.prompt_length
        char_cut = self.message_char_ends[keep - 1] if keep else self.completion_char_start
        return RoleTokens(
            self.input_ids[:cut], self.roles[:cut].copy(), self.prompt_length, self.world_loss_target,
            truncated_tokens=self.truncated_tokens + len(self.input_ids) - cut,
            truncated_messages=self.truncated_messages + len(self.message_token_spans) - keep,
            text=self.text[:char_cut], message_token_spans=self.message_token_spans[:keep],
            message_char_ends=self.message_char_ends[:keep], completion_char_start=self.completion_char_start)

    def _mask(self, *codes: int) -> list[int]:
        return np.isin(self.roles, codes).astype(np.int64).tolist()

    @property
    def action_mask(self) -> list[int]:
        return self._mask(ACTION)

    @property
    def env_output_mask(self) -> list[int]:
        return self._mask(ENV_OUTPUT)

    @property
    def warning_mask(self) -> list[int]:
        return self._mask(WARNING)

    @property
    def observation_mask(self) -> list[int]:
        """Template wrapper tokens of tool messages (not their content)."""
        return self._mask(OBSERVATION)

    @property
    def world_mask(self) -> list[int]:
        """Tokens the world-model loss trains on under ``world_loss_target``."""
        return self._mask(*world_codes(self.world_loss_target))

    def counts(self) -> dict[str, int]:
        c = np.bincount(self.roles, minlength=5)
        return {"context": int(c[CONTEXT] + c[OBSERVATION]), "action": int(c[ACTION]),
                "env_output": int(c[ENV_OUTPUT]), "warning": int(c[WARNING])}

    def as_dict(self) -> dict[str, Any]:
        return {"input_ids": self.input_ids, "action_mask": self.action_mask,
                "env_output_mask": self.env_output_mask, "warning_mask": self.warning_mask,
                "world_mask": self.world_mask, "prompt_length": self.prompt_length,
                "truncated_tokens": self.truncated_tokens, "truncated_messages": self.truncated_messages}


def world_codes(target: str) -> tuple[int, ...]:
    if target not in WORLD_LOSS_TARGETS:
        raise ValueError(f"world_loss_target must be one of {', '.join(WORLD_LOSS_TARGETS)}, got {target!r}")
    return {"env_only": (ENV_OUTPUT,), "observation": (ENV_OUTPUT, OBSERVATION),
            "all": (ENV_OUTPUT, OBSERVATION, WARNING)}[target]


# --------------------------------------------------------------------------------------------
# Template facts, derived once per tokenizer from tiny probe conversations


@dataclass(frozen=True)
class TemplateInfo:
    generation_prompt: str  # what add_generation_prompt appends: the assistant turn header
    end_markers: tuple[str, ...]  # tokens that end a generated turn
    tool_content: str | None  # "verbatim" | "escaped" when tool content is inserted as-is, else None


_TEMPLATE_CACHE: dict[tuple[int, str], TemplateInfo] = {}


def _render(tokenizer, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # jinja raises many types; all mean "this template cannot render this"
        raise TemplateError(f"chat template failed to render the conversation: {exc}") from exc


def template_info(tokenizer) -> TemplateInfo:
    """Generation prompt and end-of-turn markers of ``tokenizer``'s chat template."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise TemplateError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; ECHO renders each "
            "trajectory with the model's own template (set tokenizer.chat_template)")
    key = (id(tokenizer), template if isinstance(template, str) else json.dumps(template))
    if key in _TEMPLATE_CACHE:
        return _TEMPLATE_CACHE[key]
    convo = [{"role": "user", "content": "x"}]
    plain = _render(tokenizer, convo, None)
    with_gen = _render(tokenizer, convo, None, add_generation_prompt=True)
    if not with_gen.startswith(plain) or len(with_gen) == len(plain):
        raise TemplateError("chat template has no generation prompt (add_generation_prompt changes nothing)")
    generation_prompt = with_gen[len(plain):]

    probe = _PROBE.format("A")
    text = _render(tokenizer, [*convo, {"role": "assistant", "content": probe}, {"role": "user", "content": "y"}], None)
    after = text[text.index(probe) + len(probe):]
    specials = sorted({*tokenizer.all_special_tokens,
                       *(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)},
                      key=len, reverse=True)
    markers = {s for s in specials if after.startswith(s)}
    if tokenizer.eos_token:
        markers.add(tokenizer.eos_token)
    if not markers:
        raise TemplateError("cannot find the end-of-turn token of the chat template's assistant turns")
    info = TemplateInfo(generation_prompt, tuple(sorted(markers, key=len, reverse=True)),
                        _tool_content_mode(tokenizer))
    _TEMPLATE_CACHE[key] = info
    return info


def _tool_content_mode(tokenizer) -> str | None:
    """How the template inserts tool content, if it does so independently of the value.

    Two unlike contents are rendered; if both come out verbatim (or both JSON-escaped), a tool
    message's text can be spliced into a probe render instead of rendering twice.
    """
    modes = set()
    for content in (' A"b\n\\c\t ', '\n{"k": "v"}\n'):  # unlike, and both change when escaped
        convo = [{"role": "user", "content": "x"},
                 {"role": "assistant", "content": "", "tool_calls": [tool_call("f", {})]},
                 {"role": "tool", "name": "f", "content": content}]
        try:
            text = _render(tokenizer, convo, None)
        except TemplateError:
            return None
        modes.add("verbatim" if content in text else "escaped" if _escaped(content) in text else None)
    return modes.pop() if len(modes) == 1 else None


#: Tokenizers whose splice-instead-of-render result was checked against a real render.
_SPLICE_CHECKED: dict[tuple[int, str], bool] = {}


def _splice(probe_text: str, contents: dict[int, str], mode: str) -> str:
    """The probe render with each probe replaced by its tool content as the template renders it."""
    out, last = [], 0
    for i in sorted(contents):
        probe = _PROBE.format(i)
        at = probe_text.find(probe, last)
        out += [probe_text[last:at], _escaped(contents[i]) if mode == "escaped" else contents[i]]
        last = at + len(probe)
    out.append(probe_text[last:])
    return "".join(out)


def _find_end(text: str, start: int, markers: tuple[str, ...]) -> int:
    """End (exclusive) of the first end-of-turn marker at or after ``start``; len(text) if none."""
    best = -1
    best_end = len(text)
    for m in markers:
        i = text.find(m, start)
        if i != -1 and (best == -1 or i < best):
            best, best_end = i, i + len(m)
    return best_end


def _escaped(s: str) -> str:
    """``s`` as a chat template's ``tojson`` renders it, without the quotes."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


# --------------------------------------------------------------------------------------------
# Character spans


@dataclass
class _Layout:
    text: str
    char_roles: np.ndarray  # int8 per character
    completion_start: int  # char where the first action begins
    message_ends: list[int]  # per completion message: char after its turn's end marker
    preamble_end: int  # end of the first turn (system + tools) when it ends in an end-of-turn token, else 0


def _tool_pieces(content: str, warnings: list[str]) -> list[tuple[int, str]]:
    pieces = [(ENV_OUTPUT, content)]
    for w in warnings:
        pieces += [(CONTEXT, WARNING_SEPARATOR), (WARNING, w)]
    return pieces


def layout(tokenizer, trajectory: Trajectory) -> _Layout:
    """Render ``trajectory`` and give every character of the rendered text a role."""
    info = template_info(tokenizer)
    prompt, completion = trajectory.prompt, trajectory.completion
    tools = trajectory.tools or None
    pieces = {i: _tool_pieces(m.get("content") or "", trajectory.warnings[i])
              for i, m in enumerate(completion) if m["role"] == "tool"}
    contents = {i: "".join(p for _, p in pieces[i]) for i in pieces}
    real = [*prompt, *[({**m, "content": contents[i]} if i in pieces else m) for i, m in enumerate(completion)]]
    if not pieces:
        text = _render(tokenizer, real, tools)

    # Where each tool message's content lands: a render with probes in its place. Rendering the
    # real conversation as well is needed only when the template does not insert tool content
    # as-is (checked once per tokenizer against a real render, then spliced).
    starts: dict[int, tuple[int, bool]] = {}
    if pieces:
        probed = [*prompt, *[({**m, "content": _PROBE.format(i)} if i in pieces else m)
                             for i, m in enumerate(completion)]]
        probe_text = _render(tokenizer, probed, tools)
        for i in pieces:
            at = probe_text.find(_PROBE.format(i))
            if at == -1 or probe_text.find(_PROBE.format(i), at + 1) != -1:
                raise TemplateError("chat template does not render each tool message's content exactly once")
        key = (id(tokenizer), info.generation_prompt)
        if info.tool_content and _SPLICE_CHECKED.get(key):
            text = _splice(probe_text, contents, info.tool_content)
        else:
            text = _render(tokenizer, real, tools)
            if info.tool_content and key not in _SPLICE_CHECKED:
                _SPLICE_CHECKED[key] = _splice(probe_text, contents, info.tool_content) == text
        shift = 0
        for i in sorted(pieces):
            probe = _PROBE.format(i)
            at = probe_text.find(probe)
            full = contents[i]
            pos = at + shift
            # A prefix test alone is ambiguous ("\\" is a prefix of its own escaped form "\\\\"):
            # trust the template's known mode, else prefer the escaped form when it differs.
            forms = {"verbatim": [False], "escaped": [True]}.get(info.tool_content, [True, False])
            matches = [esc for esc in forms if text.startswith(_escaped(full) if esc else full, pos)]
            if matches:
                escaped = matches[0]
            else:
                raise TemplateError(
                    f"chat template alters the text of tool message {i} (neither verbatim nor JSON-escaped)")
            starts[i] = (pos, escaped)
            shift += len(_escaped(full) if escaped else full) - len(probe)
        if len(probe_text) + shift != len(text):
            raise TemplateError("chat template renders tool output in a content-dependent way; cannot align roles")
    roles = np.zeros(len(text), dtype=np.int8)

    gen = info.generation_prompt
    cursor = 0
    completion_start = None
    ends: list[int] = []
    for i, m in enumerate(completion):
        if m["role"] == "assistant":
            head = text.find(gen, cursor)
            if head == -1:
                raise TemplateError(f"cannot find the assistant turn of completion message {i} in the rendered text")
            a = head + len(gen)
            e = _find_end(text, a, info.end_markers)
            for call in m.get("tool_calls") or []:
                if call["function"]["name"] not in text[a:e]:
                    raise TemplateError(
                        "chat template does not render assistant tool_calls (no tool-calling support?): "
                        f"{call['function']['name']!r} missing from completion message {i}")
            roles[a:e] = ACTION
            completion_start = a if completion_start is None else completion_start
            cursor = e
        elif i in starts:
            pos, escaped = starts[i]
            obs_start = cursor
            for code, piece in pieces[i]:
                n = len(_escaped(piece) if escaped else piece)
                roles[pos:pos + n] = code
                pos += n
            e = _find_end(text, pos, info.end_markers)
            nxt = text.find(gen, pos)
            obs_end = len(text) if nxt == -1 else nxt
            window = roles[obs_start:obs_end]
            window[window == CONTEXT] = OBSERVATION
            cursor = e
        else:
            # Other roles in a completion (e.g. a user follow-up) are context; skip their turn.
            e = _find_end(text, cursor, info.end_markers)
            cursor = e
        ends.append(e)
    if completion_start is None:
        completion_start = len(text)
    # Everything before the first action is the prompt, including the generation prompt.
    roles[:completion_start][roles[:completion_start] == OBSERVATION] = CONTEXT
    first_end = _find_end(text, 0, info.end_markers)
    preamble_end = first_end if first_end < completion_start else 0
    return _Layout(text, roles, completion_start, ends, preamble_end)


# --------------------------------------------------------------------------------------------
# Tokens


class _Encoder:
    """Encodes rendered conversations; reuses the tokens of a shared preamble.

    The system turn (system prompt + tool schemas) is identical across a scenario's episodes
    and is most of an AWM episode's text. Added special tokens split the input before BPE
    runs, so tokenizing ``text[:p]`` and ``text[p:]`` separately, where ``p`` ends a special
    end-of-turn token, gives exactly the ids of tokenizing ``text`` whole. That is checked
    against a whole-text encode the first time per tokenizer; on any mismatch the cache is
    switched off for that tokenizer (and a warning says so).
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
        return [(list(ids), np.asarray(offs, dtype=np.int64).reshape(-1, 2)[:, 0])
                for ids, offs in zip(enc["input_ids"], enc["offset_mapping"], strict=True)]

    def encode(self, texts: list[str], splits: list[int]) -> list[tuple[list[int], np.ndarray]]:
        """Ids and token start offsets of each text; ``splits[i]`` is a safe preamble end (0: none)."""
        if not self.enabled:
            return self._raw(texts)
        pres = [t[:p] for t, p in zip(texts, splits, strict=True)]
        missing = sorted({p for p in pres if p and p not in self.cache})
        for pre, enc in zip(missing, self._raw(missing), strict=True):
            if len(self.cache) >= self.max_entries:
                self.cache.pop(next(iter(self.cache)))
            self.cache[pre] = enc
        rests = self._raw([t[len(p):] for t, p in zip(texts, pres, strict=True)])
        out = []
        for pre, (ids, starts) in zip(pres, rests, strict=True):
            if pre:
                pids, pstarts = self.cache[pre]
                ids, starts = pids + ids, np.concatenate([pstarts, starts + len(pre)])
            out.append((ids, starts))
        if not self.verified and texts:
            self.verified = True
            whole = self._raw(texts[:1])[0]
            if whole[0] != out[0][0] or not np.array_equal(whole[1], out[0][1]):
                warnings.warn("echo_trl: preamble token cache does not reproduce whole-text tokenization for "
                              "this tokenizer; tokenizing every conversation whole (slower, still exact)",
                              stacklevel=3)
                self.enabled = False
                self.cache.clear()
                return self._raw(texts)
        return out


_ENCODERS: dict[int, _Encoder] = {}


def _encoder(tokenizer) -> _Encoder:
    enc = _ENCODERS.get(id(tokenizer))
    if enc is None or enc.tokenizer is not tokenizer:
        enc = _ENCODERS[id(tokenizer)] = _Encoder(tokenizer)
    return enc


def tokenize_with_roles(
    tokenizer,
    row: dict[str, Any] | Trajectory,
    *,
    max_length: int | None = None,
    world_loss_target: str = "env_only",
) -> RoleTokens:
    """Token ids of a trajectory (dataset row or :class:`Trajectory`) with per-token roles.

    ``max_length`` cuts at the end of a completion message (never inside one), keeping masks
    aligned; what was cut is reported in ``truncated_tokens`` / ``truncated_messages``.
    Raises :class:`TruncationError` if even the prompt does not fit.
    """
    return tokenize_batch(tokenizer, [row], max_length=max_length, world_loss_target=world_loss_target)[0]


def tokenize_batch(
    tokenizer,
    rows: list[dict[str, Any] | Trajectory],
    *,
    max_length: int | None = None,
    world_loss_target: str = "env_only",
) -> list[RoleTokens]:
    """:func:`tokenize_with_roles` for many trajectories: one batched (parallel, Rust) encode."""
    world_codes(world_loss_target)  # validate early
    layouts = [layout(tokenizer, r if isinstance(r, Trajectory) else row_to_trajectory(r)) for r in rows]
    encoded = _encoder(tokenizer).encode([lay.text for lay in layouts], [lay.preamble_end for lay in layouts])
    return [_assign(lay, ids, starts, max_length, world_loss_target)
            for lay, (ids, starts) in zip(layouts, encoded, strict=True)]


def _assign(lay: _Layout, ids: list[int], starts: np.ndarray, max_length: int | None, target: str) -> RoleTokens:
    n_chars = len(lay.text)
    token_roles = lay.char_roles[np.minimum(starts, max(n_chars - 1, 0))] if n_chars else np.zeros(0, np.int8)
    prompt_length = int(np.searchsorted(starts, lay.completion_start, side="left"))
    ends = [int(np.searchsorted(starts, e, side="left")) for e in lay.message_ends]
    spans = [(prompt_length if k == 0 else ends[k - 1], ends[k]) for k in range(len(ends))]
    result = RoleTokens(ids, token_roles.astype(np.int8), prompt_length, target, text=lay.text,
                        message_token_spans=spans, message_char_ends=list(lay.message_ends),
                        completion_char_start=lay.completion_start)
    return result if max_length is None else result.truncate(max_length)


_ROLE_NAMES = {CONTEXT: "context", ACTION: "action", ENV_OUTPUT: "env_output", WARNING: "warning",
               OBSERVATION: "observation"}


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
            code = int(roles[start])
            if code == CONTEXT:
                if hide_context_over is not None and len(text) > hide_context_over:
                    half = hide_context_over // 2
                    text = f"{text[:half]}[... {len(text) - 2 * half} characters ...]{text[-half:]}"
                out.append(text)
            else:
                out.append(f"[{_ROLE_NAMES[code]}]{text}[/{_ROLE_NAMES[code]}]")
            start = i
    return "".join(out)
