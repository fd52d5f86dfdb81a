"""An OpenAI-compatible chat-completions client (vLLM, SGLang, ``transformers serve``, hosted APIs).

It talks ``POST {URL}/chat/completions`` with ``httpx`` and reads the raw JSON, so vLLM's fields outside
the OpenAI schema (``token_ids``, ``prompt_token_ids``) arrive as sent. :class:`OpenAIClient` sends one
request with a timeout, retried with exponential back-off (or the server's ``Retry-After``) on 429, 5xx
and broken connections; a server still failing after the retries is an :class:`InferenceServerError`.
With ``logprobs="auto"`` the first request asks for the sampler's tokens (vLLM's ``logprobs``,
``return_token_ids``, ``return_tokens_as_token_ids``); a server that refuses those fields with 400/422
is asked without them from then on (``transformers serve`` rejects the vLLM ones). A request the server
refuses as too long for the model is a :class:`RequestRefused` (the caller stops that conversation).

What the responses mean (turns, tool calls, token ids) is the caller's business: this module only
delivers them.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..errors import EchoTrlError

#: Request fields that ask vLLM for the sampler's token ids and per-token log-probs (its documented extras).
VLLM_TOKEN_FIELDS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}
LOGPROB_MODES = ("auto", "on", "off")
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_CONTEXT_WORDS = ("context length", "context window", "maximum context", "too long", "max_tokens", "max_model_len")


class ClientError(EchoTrlError):
    """The client cannot be used as configured (not an http(s) URL, an unknown log-prob mode)."""


class InferenceServerError(ClientError):
    """The inference server cannot be used (unreachable, failing after retries, refusing the settings)."""

    def __init__(self, message: str, *, status: int | None = None, detail: str = ""):
        super().__init__(message)
        self.status, self.detail = status, detail


class RequestRefused(ClientError):
    """The server refused one request as too long for the model: that episode stops, the run goes on."""


def api_base(url: str) -> str:
    """The API base requests go under: ``URL`` as the OpenAI client takes it (``.../v1``); a bare
    ``http://host:port`` gets ``/v1``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ClientError(f"--policy openai:URL needs an http(s) URL, e.g. http://127.0.0.1:8000/v1; got {url!r}")
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
            raise ClientError(f"logprobs must be one of {', '.join(LOGPROB_MODES)}, got {self.logprobs!r}")
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
