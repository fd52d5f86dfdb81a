"""The role audit: every row's token roles checked against its messages, whatever derived them.

Roles are derived from a chat template's renders (:mod:`echo_trl.tokens.template.layout`); a template shape the
derivation misreads would otherwise train silently on wrong tokens (an action run that runs on into a
tool message's header trains the policy on the environment's text). The audit reads only the tokens,
their roles and the messages, and refuses the row (:class:`RoleAuditError`, one line naming the message
and the offending text) unless:

* the runs of non-context roles come in message order: one ``action`` run per assistant message, one
  ``env_output`` run per tool message with content, one ``warning`` run per warning, nothing else;
* each ``env_output`` (``warning``) run is its message's content (warning) as the template rendered it:
  verbatim, JSON-escaped or stripped. The stated whitespace join: a run may carry whitespace the template
  puts around the content, and may leave out the content's own leading or trailing whitespace where a
  token merges it with the template's. Content held whole by one template token that starts before it
  (a JSON quote merged with a one-character output) has no run: a token's role is its first character's;
* each ``action`` run holds its assistant message's payload (every tool call's name and string argument
  values, its content where the template renders it) and no tool message's content; it begins where the
  template's generation prompt for that turn ends (as far as the turn agrees with it); after the payload
  it holds only added tokens, punctuation and closing markup (never a word: the next message's header),
  and it ends on a special token (the turn's end-of-turn token), unless the text ends there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from ..errors import TemplateError
from ..roles import Role

ACTION, ENV, WARNING = Role.ACTION.code, Role.ENV_OUTPUT.code, Role.WARNING.code

#: What may follow the last payload of an action run, once added tokens are taken out: punctuation and
#: whitespace (``"}}``, ``')]``, a code fence) and closing markup tags (``</parameter>``), never a word (the
#: next message's header: ``user``, ``ipython``, ``functions.x to=assistant``).
_CLOSING = re.compile(r"(?:[^\w]|_|</[\w:.=\-]+>)*")


class RoleAuditError(TemplateError):
    """A row whose roles do not match its messages: refused rather than trained on."""


@dataclass(frozen=True)
class Run:
    role: int
    start: int  # first character
    end: int  # after the last character
    text: str
    first: int  # first token
    last: int  # last token


def role_runs(text: str, starts: np.ndarray, roles: np.ndarray) -> list[Run]:
    """Maximal runs of consecutive tokens with one of the learnable roles, as character spans of ``text``."""
    keep = np.isin(roles, (ACTION, ENV, WARNING))
    codes = np.where(keep, roles, -1)
    edges = np.flatnonzero(np.diff(np.concatenate([[-2], codes, [-2]]))) if len(codes) else np.zeros(1, int)
    runs = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        if codes[a] == -1:
            continue
        start = int(starts[a])
        end = int(starts[b]) if b < len(starts) else len(text)
        runs.append(Run(int(codes[a]), start, end, text[start:end], int(a), int(b) - 1))
    return runs


def _forms(text: str) -> list[str]:
    """How a template may render ``text``: verbatim, JSON-escaped, stripped (at either end: a template that
    strips a tool message strips its output and its warnings as one text)."""
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    return list(dict.fromkeys([text, escaped, text.strip(), escaped.strip(), text.lstrip(), text.rstrip()]))


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:60] + "..." + text[-15:])


def _expected(completion: list[dict], warnings: list[list[str]]) -> list[tuple[int, int, str, bool]]:
    """(role, message, expected text, required) per run, in order."""
    out = []
    for k, m in enumerate(completion):
        if m.get("role") == "assistant":
            out.append((ACTION, k, "", True))
        elif m.get("role") == "tool":
            content = m.get("content") or ""
            if content:
                out.append((ENV, k, content, bool(content.strip())))
            for w in warnings[k] if k < len(warnings) else []:
                if w:
                    out.append((WARNING, k, w, bool(w.strip())))
    return out


NAME, VALUE, OPTIONAL = "name", "value", "optional"


def _value_forms(value: object) -> list[str]:
    """How a template may render one argument value: as is, JSON-escaped, with quotes backslash-escaped
    (Python-style calls), or as JSON / Python text for non-strings."""
    if isinstance(value, str):
        return list(dict.fromkeys([value, *_forms(value)[1:2], value.replace("\\", "\\\\").replace("'", "\\'")]))
    return list(dict.fromkeys([json.dumps(value, ensure_ascii=False), str(value)]))


def _payload(message: dict) -> list[tuple[str, list[tuple[list[str], str]]]]:
    """An assistant message's payload as (content forms, ...) then, per tool call, its name and its pieces:
    (forms, kind) where a call's ``name`` and string ``value``\\ s must be in its action run and ``optional``
    pieces (content, other values, the arguments as JSON, the call id) may be left out by a template."""
    calls: list[tuple[str, list[tuple[list[str], str]]]] = []
    content = message.get("content")
    if isinstance(content, str) and content.strip():
        calls.append(("", [(_forms(content.strip()), OPTIONAL)]))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call)
        args = fn.get("arguments")
        pieces: list[tuple[list[str], str]] = []
        values = [args] if isinstance(args, str) else list(args.values()) if isinstance(args, dict) else []
        for v in values:
            if v is not None and (not isinstance(v, str) or v.strip()):
                pieces.append((_value_forms(v), VALUE if isinstance(v, str) else OPTIONAL))
        if isinstance(args, dict):  # where a template renders the arguments as JSON, all of it
            pieces.append(([json.dumps(args, ensure_ascii=False), json.dumps(args)], OPTIONAL))
        if call.get("id"):
            pieces.append(([str(call["id"])], OPTIONAL))
        calls.append((fn["name"], pieces))
    return calls


def _is_content(run: Run, content: str, text: str, starts: np.ndarray) -> bool:
    """Whether ``run`` is exactly ``content`` as rendered: every token of the run starts inside the rendered
    content, and every character of it is in the run, except leading characters held by a token that starts
    before it (the last token may run on past it: a token that holds the content's last character and the
    template's next one is the content's)."""
    for form in _forms(content):
        if not form:
            continue
        lo = max(0, run.start - len(form))
        at = text.find(form, lo, run.end + len(form))
        while at != -1 and at <= run.start:
            end = at + len(form)
            inside = at <= run.start and int(starts[run.last]) < end <= run.end
            led = run.start == at or (run.first > 0 and int(starts[run.first - 1]) < at)
            if inside and led:
                return True
            at = text.find(form, at + 1, run.end + len(form))
    return False


def _merged_away(content: str, text: str, starts: np.ndarray, lo: int, hi: int) -> bool:
    """Whether ``content`` has no token of its own between ``lo`` and ``hi``: it occurs there in a rendered form,
    and every occurrence lies wholly inside one token that starts before it (a JSON-rendering template's opening
    quote merged with a one-character output: ``","``). A token role is its first character's, so such content
    has no token to carry its role; any occurrence a token starts inside keeps the run required."""
    seen = False
    for form in _forms(content):
        at = text.find(form, lo, hi) if form else -1
        while at != -1:
            j = int(np.searchsorted(starts, at, side="right")) - 1
            token_end = int(starts[j + 1]) if j + 1 < len(starts) else len(text)
            if j < 0 or starts[j] >= at or token_end < at + len(form):
                return False
            seen = True
            at = text.find(form, at + 1, hi)
    return seen


def _check_action(run: Run, message: dict, k: int, text: str, gen: str, specials, added, tool_texts) -> None:
    where = f"completion message {k} (assistant)"
    pos, last_end = 0, 0
    pos, last_end = 0, 0
    for name, pieces in _payload(message):
        if name:
            at = run.text.find(name, pos)
            if at == -1:
                raise RoleAuditError(f"role audit: {where}: its action run lacks {name!r}: {_short(run.text)}")
            pos = at
            last_end = max(last_end, run.text.rfind(name) + len(name))
        end_of_call = pos
        for forms, kind in pieces:  # in any order within the call (templates sort keys, move ids)
            found = [(at, at + len(f)) for f in forms if f and (at := run.text.find(f, pos)) != -1]
            if not found:
                if kind == VALUE:
                    raise RoleAuditError(f"role audit: {where}: its action run lacks {forms[0]!r}: {_short(run.text)}")
                continue
            end_of_call = max(end_of_call, *(end for _, end in found))
            last_end = max(last_end, *(run.text.rfind(f) + len(f) for f in forms if f and f in run.text))
        pos = end_of_call
    for foreign in tool_texts:
        if foreign in run.text:
            raise RoleAuditError(f"role audit: {where}: its action run holds tool output {_short(foreign)}")
    if gen:
        m = next((m for m in range(min(len(gen), run.start), 0, -1) if text.startswith(gen[:m], run.start - m)), 0)
        if m == 0 or (m < len(gen) and text.startswith(gen[m:], run.start)):
            raise RoleAuditError(
                f"role audit: {where}: its action run does not begin where the generation prompt {gen!r} "
                f"ends: {_short(text[max(0, run.start - 30) : run.start + 30])}"
            )
    tail = run.text[last_end:]
    residue = tail
    for t in added:  # longest first
        residue = residue.replace(t, "\x00")
    if not _CLOSING.fullmatch(residue.replace("\x00", "")):
        raise RoleAuditError(f"role audit: {where}: its action run goes on past its turn: {_short(tail)}")
    if run.end < len(text) and not any(run.text.endswith(t) for t in specials):
        raise RoleAuditError(
            f"role audit: {where}: its action run does not end on an end-of-turn token: {_short(tail)}"
        )


def audit_roles(
    text: str,
    starts: np.ndarray,
    roles: np.ndarray,
    completion: list[dict],
    warnings: list[list[str]],
    generation_prompts: dict[str, str],
    special_tokens: tuple[str, ...],
    added_tokens: tuple[str, ...],
) -> None:
    """Refuse (:class:`RoleAuditError`) a row whose token roles do not match its messages (module docstring).

    ``starts`` are the tokens' first characters in ``text``, ``roles`` their role codes; ``completion`` and
    ``warnings`` the completion messages as rendered; ``generation_prompts`` what ``add_generation_prompt``
    appends after a ``user`` and after a ``tool`` message; ``special_tokens`` and ``added_tokens`` the
    tokenizer's special and added tokens (longest first).
    """
    runs = role_runs(text, starts, roles)
    expected = _expected(completion, warnings)
    tool_texts = [
        f
        for m in completion
        if m.get("role") == "tool" and len((m.get("content") or "").strip()) >= 8
        for f in _forms(m["content"].strip())[:2]
    ]
    i, cursor = 0, 0  # cursor: where the last matched run ends
    for role, k, want, required in expected:
        run = runs[i] if i < len(runs) else None
        name = Role.of_code(role).value
        if run is None or run.role != role:
            if not required:
                continue  # whitespace-only content may be merged into the template's tokens
            if role != ACTION and _merged_away(want, text, starts, cursor, run.start if run else len(text)):
                continue  # every character held by a template token that starts before it: no token to learn
            found = "nothing" if run is None else f"a {Role.of_code(run.role).value} run {_short(run.text)}"
            raise RoleAuditError(
                f"role audit: completion message {k} ({completion[k]['role']}): expected its {name} run, found {found}"
            )
        i += 1
        cursor = run.end
        if role == ACTION:
            after = "tool" if k and completion[k - 1].get("role") == "tool" else "user"
            _check_action(
                run,
                completion[k],
                k,
                text,
                generation_prompts.get(after, ""),
                special_tokens,
                added_tokens,
                tool_texts,
            )
        elif not _is_content(run, want, text, starts):
            raise RoleAuditError(
                f"role audit: completion message {k} (tool): its {name} run is not its text: {_short(run.text)}"
            )
    if i < len(runs):
        run = runs[i]
        raise RoleAuditError(
            f"role audit: a {Role.of_code(run.role).value} run that belongs to no message: {_short(run.text)}"
        )
