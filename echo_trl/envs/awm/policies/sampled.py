"""One chat-completion response as the assistant turn it sampled (pure; errors name the field).

:func:`sampled_turn`: one response (OpenAI's schema plus vLLM's token fields) -> :class:`SampledTurn`:
text, tool calls, token ids and per-token log-probs when present, the prompt's token count and hash.
What the server sends is untrusted: a malformed field is a :class:`~echo_trl.envs.awm.policies.policy.PolicyError`
naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ....data.records import token_ids_hash
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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"content": self.content, "finish_reason": self.finish_reason, "usage": self.usage}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.reasoning:
            out["reasoning"] = self.reasoning
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


def _ids(values: Any, where: str) -> list[int]:
    _expect(values, list, where, "a list of token ids")
    return [_expect(v, int, f"{where}[{i}]", "an integer") for i, v in enumerate(values)]


def sampled_turn(response: Any) -> SampledTurn:
    """The assistant turn of a chat completion response (OpenAI's schema plus vLLM's token fields).

    Token ids come from ``choices[0].token_ids`` (vLLM ``return_token_ids``) or from the
    ``token_id:N`` strings of ``logprobs.content[*].token`` (``return_tokens_as_token_ids``);
    log-probs from ``logprobs.content[*].logprob``. Absent fields stay ``None``; malformed ones are a
    :class:`PolicyError` naming the field.
    """
    _expect(response, dict, "response", "a JSON object")
    choices = _expect(response.get("choices"), list, "choices", "a list")
    if not choices:
        raise PolicyError("server response: choices: empty")
    choice = _expect(choices[0], dict, "choices[0]", "an object")
    message = _expect(choice.get("message"), dict, "choices[0].message", "an object")
    content = message.get("content") or ""
    _expect(content, str, "choices[0].message.content", "a string")
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        here = f"choices[0].message.tool_calls[{i}]"
        fn = _expect(_expect(call, dict, here, "an object").get("function"), dict, f"{here}.function", "an object")
        name = _expect(fn.get("name"), str, f"{here}.function.name", "a string")
        args = fn.get("arguments")
        calls.append({"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)})
    logprobs = tokens = None
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and lp.get("content") is not None:
        entries = _expect(lp["content"], list, "choices[0].logprobs.content", "a list")
        logprobs, tokens = [], []
        for i, e in enumerate(entries):
            here = f"choices[0].logprobs.content[{i}]"
            _expect(e, dict, here, "an object")
            logprobs.append(float(_expect(e.get("logprob"), (int, float), f"{here}.logprob", "a number")))
            tokens.append(_expect(e.get("token"), str, f"{here}.token", "a string"))
    token_ids = None
    if choice.get("token_ids") is not None:
        token_ids = _ids(choice["token_ids"], "choices[0].token_ids")
    elif tokens and all(t.startswith("token_id:") for t in tokens):
        token_ids = [int(t[len("token_id:") :]) for t in tokens]
    prompt = None
    if response.get("prompt_token_ids") is not None:
        ids = _ids(response["prompt_token_ids"], "prompt_token_ids")
        prompt = {"count": len(ids), "sha256": token_ids_hash(ids)}
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    return SampledTurn(
        content,
        calls,
        choice.get("finish_reason"),
        token_ids,
        logprobs,
        prompt,
        {k: int(v) for k, v in usage.items() if k in ("prompt_tokens", "completion_tokens") and isinstance(v, int)},
        reasoning if isinstance(reasoning, str) else None,
    )
