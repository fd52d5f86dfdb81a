"""Play AWM episodes with a model behind an OpenAI-compatible server (``--policy openai:URL``).

vLLM, SGLang, ``transformers serve`` and hosted providers all answer
``POST {URL}/chat/completions``; this module talks to it with ``httpx`` (raw JSON, so vLLM's fields
outside the OpenAI schema, ``token_ids`` and ``prompt_token_ids``, are read as sent).

* :class:`OpenAIClient`: one request with a timeout, retried with exponential back-off (or the
  server's ``Retry-After``) on 429, 5xx and broken connections; a server still failing after the
  retries is an :class:`InferenceServerError` (the run stops, finished episodes are kept). With
  ``logprobs="auto"`` the first request asks for the sampler's tokens (vLLM's ``logprobs``,
  ``return_token_ids``, ``return_tokens_as_token_ids``); a server that refuses those fields with
  400/422 is asked without them from then on (``transformers serve`` rejects the vLLM ones).
* :func:`sampled_turn`: one response -> :class:`SampledTurn` (text, tool calls, token ids and
  per-token log-probs when present, the prompt's token count and hash). Pure; errors name the field.
* :class:`OpenAIPolicy`: the episode loop in either conversation format. The live conversation is
  built with the functions the dataset builder renders the recording with, so the prompt of every
  turn is the one the trainer sees: chat-template (the scenario's tools as the API's ``tools``, one
  assistant message per tool call, the server's parsed ``tool_calls``) or awm-agent (the official
  agent's system prompt, no ``tools``, each turn's text parsed with
  :func:`echo_trl.data.awm_agent.next_action`, replies from :func:`agent_reply`).

Every turn is kept in the record under ``sampler.turns`` (in generation order; ``play`` returns
them); aligning them with
the trainer's tokenization into ``behavior_logprobs`` needs the tokenizer, so it happens outside
``envs/`` (``echo_trl.tokens.sampled``).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ...data import awm_agent
from ...data.prompt import DEFAULT_SYSTEM_PROMPT, prompt_messages
from ...data.records import token_ids_hash
from ...roles import Message, tool_call
from .agent_format import agent_reply
from .episode import Episode
from .policy import PolicyError, live_prompt, observation_text

#: Request fields that ask vLLM for the sampler's token ids and per-token log-probs (its documented extras).
VLLM_TOKEN_FIELDS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}
LOGPROB_MODES = ("auto", "on", "off")
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_CONTEXT_WORDS = ("context length", "context window", "maximum context", "too long", "max_tokens", "max_model_len")


class InferenceServerError(PolicyError):
    """The inference server cannot be used (unreachable, failing after retries, refusing the settings)."""

    def __init__(self, message: str, *, status: int | None = None, detail: str = ""):
        super().__init__(message)
        self.status, self.detail = status, detail


class RequestRefused(PolicyError):
    """The server refused one request as too long for the model: that episode stops, the run goes on."""


def api_base(url: str) -> str:
    """The API base requests go under: ``URL`` as the OpenAI client takes it (``.../v1``); a bare
    ``http://host:port`` gets ``/v1``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PolicyError(f"--policy openai:URL needs an http(s) URL, e.g. http://127.0.0.1:8000/v1; got {url!r}")
    return url.rstrip("/") + ("/v1" if parts.path in ("", "/") else "")


def backoff_seconds(attempt: int, base: float, retry_after: str | None = None, cap: float = 30.0) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): the server's ``Retry-After`` when it gives a number,
    else ``base * 2**attempt`` (capped), with up to 10% jitter so concurrent episodes do not retry in step."""
    if retry_after is not None:
        with contextlib.suppress(ValueError):
            return min(max(float(retry_after), 0.0), 2 * cap)
    return min(base * 2**attempt, cap) * (1.0 + 0.1 * random.random())


@dataclass
class OpenAIClient:
    """Chat completions from one server; thread-safe (one ``httpx.Client`` shared by the episodes in flight)."""

    url: str
    model: str
    api_key: str | None = None
    timeout: float = 300.0
    max_retries: int = 5
    backoff: float = 1.0
    logprobs: str = "auto"
    _token_fields: bool | None = field(default=None, repr=False)  # None: not known yet (auto)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    refusal: str = ""  # why the server gives no token ids (auto mode fell back)

    def __post_init__(self) -> None:
        import httpx

        if self.logprobs not in LOGPROB_MODES:
            raise PolicyError(f"logprobs must be one of {', '.join(LOGPROB_MODES)}, got {self.logprobs!r}")
        self.base = api_base(self.url)
        self._token_fields = {"on": True, "off": False}.get(self.logprobs)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._http = httpx.Client(timeout=self.timeout, headers=headers, limits=httpx.Limits(max_connections=256))

    def close(self) -> None:
        self._http.close()

    @property
    def asks_token_fields(self) -> bool | None:
        return self._token_fields

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion (``model`` added); token fields per the ``logprobs`` mode."""
        if self._token_fields is None:  # auto: the first request finds out, the others wait for it
            with self._lock:
                if self._token_fields is None:
                    return self._probe(body)
        return self._post({**body, **(VLLM_TOKEN_FIELDS if self._token_fields else {})})

    def _probe(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = self._post({**body, **VLLM_TOKEN_FIELDS})
        except InferenceServerError as exc:
            if exc.status not in (400, 422) or not any(k in exc.detail for k in VLLM_TOKEN_FIELDS):
                raise
            self.refusal = f"the server refused the log-prob fields (HTTP {exc.status})"
            self._token_fields = False
            return self._post(body)
        self._token_fields = True
        return response

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        body = {"model": self.model, **body}
        where = f"{self.base}/chat/completions"
        problem = ""
        for attempt in range(self.max_retries + 1):
            retry_after = None
            try:
                r = self._http.post(where, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if r.status_code == 200:
                    try:
                        return r.json()
                    except ValueError:
                        problem = f"HTTP 200 with a body that is not JSON: {r.text[:200]!r}"
                elif r.status_code in RETRY_STATUS:
                    problem = f"HTTP {r.status_code}: {_detail(r)}"
                    retry_after = r.headers.get("retry-after")
                else:
                    detail = _detail(r)
                    if r.status_code == 400 and any(w in detail.lower() for w in _CONTEXT_WORDS):
                        raise RequestRefused(f"the server refused the request as too long: {detail}")
                    raise InferenceServerError(
                        f"inference server {where} answered HTTP {r.status_code}: {detail}",
                        status=r.status_code,
                        detail=detail,
                    )
            if attempt < self.max_retries:
                time.sleep(backoff_seconds(attempt, self.backoff, retry_after))
        raise InferenceServerError(
            f"inference server {where} still failing after {self.max_retries + 1} tries: {problem}"
        )


def _detail(response) -> str:
    """The server's error message (OpenAI's ``{"error": {"message"}}``, FastAPI's ``{"detail"}``), one line."""
    try:
        data = response.json()
    except ValueError:
        return " ".join(response.text.split())[:300]
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data))
        if isinstance(err, dict):
            err = err.get("message", err)
        return " ".join(str(err).split())[:300]
    return " ".join(str(data).split())[:300]


# --------------------------------------------------------------------------------------------
# Responses (pure)


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


# --------------------------------------------------------------------------------------------
# The episode loop


def api_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Conversation messages in the API's shape: tool-call arguments as JSON text with ids, tool replies
    pointing at them (the server turns the arguments back into objects for the chat template)."""
    out, ids = [], []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            ids = [f"call_{len(out)}_{j}" for j in range(len(m["tool_calls"]))]
            calls = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])},
                }
                for cid, c in zip(ids, m["tool_calls"], strict=True)
            ]
            out.append({"role": "assistant", "content": m.get("content") or "", "tool_calls": calls})
        elif m["role"] == "tool":
            out.append({"role": "tool", "content": m["content"], "tool_call_id": ids.pop(0) if ids else "call"})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def episode_seed(seed: int, scenario: str, task_idx: int | None, index: int) -> int:
    """A per-episode sampling seed: the same episode gets the same seed on every run (and a resumed one)."""
    return (seed * 1_000_003 + zlib.crc32(f"{scenario}/{task_idx}/{index}".encode())) % (2**31)


@dataclass
class OpenAIPolicy:
    """Samples each turn from an OpenAI-compatible server (see the module docstring)."""

    client: OpenAIClient
    format: str = "chat-template"
    max_steps: int = 8
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT  # the dataset builder's default; awm-agent: the official one
    seed: int | None = 0

    def play(self, episode: Episode, episode_index: int = 0) -> list[dict[str, Any]]:
        """Play ``episode``; returns its sampled turns in order (the collector records them as ``sampler.turns``)."""
        turns: list[dict[str, Any]] = []
        seed = self.seed
        if seed is not None:
            seed = episode_seed(seed, episode.scenario, episode.task_idx, episode_index)
        agent = self.format == "awm-agent"
        if agent:
            system = awm_agent.SYSTEM_PROMPT if self.system_prompt == DEFAULT_SYSTEM_PROMPT else self.system_prompt
            messages = prompt_messages(system, episode.scenario, episode.task)
            tools = None
        else:
            messages, tools = live_prompt(self.system_prompt, episode)
        for step in range(self.max_steps):
            body: dict[str, Any] = {
                "messages": api_messages(messages),
                "temperature": self.temperature,
                "top_p": self.top_p,
                "max_tokens": self.max_tokens,
            }
            if tools:
                body["tools"] = tools
            if seed is not None:
                body["seed"] = seed + step
            try:
                turn = sampled_turn(self.client.complete(body))
            except RequestRefused as exc:
                episode.notes.append(f"policy stopped: {exc}")
                break
            turns.append(turn.to_json())
            ended = self._agent_turn(episode, turn, messages) if agent else self._tool_turn(episode, turn, messages)
            if ended:
                return turns
        else:
            episode.notes.append(f"max_steps={self.max_steps} reached")
        if not episode.done:
            episode.verify()
        return turns

    def _tool_turn(self, episode: Episode, turn: SampledTurn, messages: list[Message]) -> bool:
        """Chat-template: each tool call a step (and an assistant message of its own, as the dataset renders it)."""
        if not turn.tool_calls:
            episode.verify(final_answer=turn.content)
            return True
        for call in turn.tool_calls:
            args: Any = call["arguments"]
            with contextlib.suppress(ValueError):
                args = json.loads(args) if args.strip() else {}
            obs = episode.call_tool(call["name"] or "<missing tool name>", args)
            action = episode.steps[-1]["action"]  # as recorded (what the dataset renders)
            name = action["tool_name"]
            messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call(name, action["arguments"])]})
            messages.append({"role": "tool", "name": name, "content": observation_text(obs)})
            if obs.get("done"):
                return True
        return False

    def _agent_turn(self, episode: Episode, turn: SampledTurn, messages: list[Message]) -> bool:
        """awm-agent: the turn's first ``<tool_call>`` as the official agent reads it; the reply as it shows it."""
        action = awm_agent.next_action(turn.content)
        if action.kind == "final":
            episode.verify(final_answer=turn.content.strip())
            return True
        reply = agent_reply(episode, action)
        if action.kind == "list_tools":
            messages.append(awm_agent.list_tools_message())
            messages.append({"role": "tool", "name": awm_agent.LIST_TOOLS, "content": reply})
        else:
            name = action.tool_name if action.kind == "call_tool" else action.name
            messages.append(awm_agent.call_tool_message(name, action.arguments))
            messages.append({"role": "tool", "name": awm_agent.CALL_TOOL, "content": reply})
        return episode.done
