"""One chat-completion response as the assistant turn it sampled (pure; errors name the field).

:func:`sampled_turn`: one response (OpenAI's schema plus vLLM's token fields) -> :class:`SampledTurn`:
text, tool calls, token ids and per-token log-probs when present, the prompt's token count and hash.
What the server sends is untrusted: a malformed field is a :class:`~echo_trl.envs.awm.policies.policy.PolicyError`
naming it (the policy ends that episode, noted). What only spoils the turn's log-probs flags the turn instead
(``problem``; the episode goes on and keeps no log-probs for it): a lone surrogate in its text (replaced by
U+FFFD, so the text is no longer what was sampled), a token id that is no token id (negative, >= 2^31, a
``token_id:`` string without a number) or a log-prob no sampler gives
(:func:`~echo_trl.data.readers.fields.logprob_problem`: NaN, above 0, below the floor).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ....data.readers.fields import logprob_problem
from ....data.readers.records import token_ids_hash
from ....io import strict_json
from .policy import PolicyError


@dataclass
class SampledTurn:
    """One assistant turn as the server returned it."""

    content: str
    tool_calls: list[dict[str, Any]]  # [{"name": str, "arguments": str}] as sent (arguments: JSON text)
    finish_reason: str | None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_tokens: dict[str, Any] | None = None  # {"count", "sha256"} of the server's prompt token ids
    usage: dict[str, int] = field(default_factory=dict)
    reasoning: str | None = None
    problem: str = ""  # why the turn's token ids / log-probs cannot be used (then they are dropped)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"content": self.content, "finish_reason": self.finish_reason, "usage": self.usage}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.problem:
            out["problem"] = self.problem
        else:
            if self.token_ids is not None:
                out["token_ids"] = self.token_ids
            if self.logprobs is not None:
                out["logprobs"] = self.logprobs
        if self.prompt_tokens is not None:
            out["prompt_tokens"] = self.prompt_tokens
        return out


def _expect(value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise PolicyError(f"server response: {where}: expected {what}, got {type(value).__name__}")
    return value


#: The largest token id accepted (vocabularies stay far below 2^31; a tokenizer's decode overflows at 2^63).
MAX_TOKEN_ID = 2**31 - 1


def _ids(values: Any, where: str) -> list[int]:
    _expect(values, list, where, "a list of token ids")
    return [_expect(v, int, f"{where}[{i}]", "an integer") for i, v in enumerate(values)]


def _id_problem(ids: list[int] | None, where: str) -> str:
    bad = next((i for i, v in enumerate(ids or []) if not 0 <= v <= MAX_TOKEN_ID), None)
    return "" if bad is None else f"{where}[{bad}]: {ids[bad]} is no token id (0..{MAX_TOKEN_ID})"


def _logprob(value: Any, field: str, where: str) -> tuple[float, str]:
    """(the log-prob, why it cannot be one or ""); not a number at all: a :class:`PolicyError` naming ``field``."""
    _expect(value, (int, float), field, "a number")
    try:
        number = float(value)
    except OverflowError:
        return 0.0, f"{where}: a {len(str(abs(value)))}-digit number is no log-prob"
    problem = logprob_problem(number)
    return number, f"{where}: {problem}" if problem else ""


def _text(value: Any, where: str, problems: list[str]) -> Any:
    """``value`` with lone surrogates replaced (each noted in ``problems``)."""
    value, changed = strict_json.scrub(value)
    if changed:
        problems.append(f"{where}: lone surrogate(s) replaced by U+FFFD (the text is not what was sampled)")
    return value


def sampled_turn(response: Any) -> SampledTurn:
    """The assistant turn of a chat completion response (OpenAI's schema plus vLLM's token fields).

    Token ids come from ``choices[0].token_ids`` (vLLM ``return_token_ids``) or from the
    ``token_id:N`` strings of ``logprobs.content[*].token`` (``return_tokens_as_token_ids``);
    log-probs from ``logprobs.content[*].logprob``. Absent fields stay ``None``; malformed ones are a
    :class:`PolicyError` naming the field; unusable token ids / log-probs and lone surrogates flag the turn
    (``problem``, module docstring).
    """
    _expect(response, dict, "response", "a JSON object")
    choices = _expect(response.get("choices"), list, "choices", "a list")
    if not choices:
        raise PolicyError("server response: choices: empty")
    choice = _expect(choices[0], dict, "choices[0]", "an object")
    message = _expect(choice.get("message"), dict, "choices[0].message", "an object")
    problems: list[str] = []
    content = message.get("content") or ""
    content = _text(_expect(content, str, "choices[0].message.content", "a string"), "content", problems)
    calls = []
    raw_calls = message.get("tool_calls") or []
    for i, call in enumerate(_expect(raw_calls, list, "choices[0].message.tool_calls", "a list")):
        here = f"choices[0].message.tool_calls[{i}]"
        fn = _expect(_expect(call, dict, here, "an object").get("function"), dict, f"{here}.function", "an object")
        name = _text(_expect(fn.get("name"), str, f"{here}.function.name", "a string"), f"{here}.name", problems)
        args = _text(fn.get("arguments"), f"{here}.arguments", problems)
        calls.append({"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)})
    finish = choice.get("finish_reason")
    if finish is not None:
        finish = _text(_expect(finish, str, "choices[0].finish_reason", "a string"), "finish_reason", problems)
    logprobs = tokens = None
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and lp.get("content") is not None:
        entries = _expect(lp["content"], list, "choices[0].logprobs.content", "a list")
        logprobs, tokens = [], []
        for i, e in enumerate(entries):
            here = f"choices[0].logprobs.content[{i}]"
            _expect(e, dict, here, "an object")
            value, problem = _logprob(e.get("logprob"), f"{here}.logprob", f"logprobs[{i}]")
            logprobs.append(value)
            if problem and not any(p.startswith("logprobs[") for p in problems):
                problems.append(problem)
            tokens.append(_expect(e.get("token"), str, f"{here}.token", "a string"))
    token_ids = None
    if choice.get("token_ids") is not None:
        token_ids = _ids(choice["token_ids"], "choices[0].token_ids")
    elif tokens and all(t.startswith("token_id:") for t in tokens):
        bad = next(
            (
                i
                for i, t in enumerate(tokens)
                if not t[len("token_id:") :].isascii() or not t[len("token_id:") :].isdigit() or len(t) > 40
            ),
            None,
        )
        if bad is None:
            token_ids = [int(t[len("token_id:") :]) for t in tokens]
        else:
            problems.append(f"logprobs[{bad}].token: {tokens[bad][:40]!r} is no token_id:N")
    if _id_problem(token_ids, "token_ids"):
        problems.append(_id_problem(token_ids, "token_ids"))
    prompt = None
    if response.get("prompt_token_ids") is not None:
        ids = _ids(response["prompt_token_ids"], "prompt_token_ids")
        prompt = {"count": len(ids), "sha256": token_ids_hash(ids)}
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    reasoning = _text(reasoning, "reasoning", problems) if isinstance(reasoning, str) else None
    return SampledTurn(
        content,
        calls,
        finish,
        token_ids,
        logprobs,
        prompt,
        {
            k: int(v)
            for k, v in usage.items()
            if k in ("prompt_tokens", "completion_tokens") and isinstance(v, int) and 0 <= v <= 2**53
        },
        reasoning,
        "; ".join(problems),
    )
