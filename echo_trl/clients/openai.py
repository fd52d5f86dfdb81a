"""An OpenAI-compatible chat-completions client (vLLM, SGLang, ``transformers serve``, hosted APIs).

It talks ``POST {URL}/chat/completions`` with ``httpx`` and reads the raw JSON, so vLLM's fields outside
the OpenAI schema (``token_ids``, ``prompt_token_ids``) arrive as sent. :class:`OpenAIClient` sends one
request with a timeout, retried with exponential back-off (or the server's ``Retry-After``) on 429, 5xx
and broken connections; a server still failing after the retries is an :class:`InferenceServerError`.
With ``logprobs="auto"`` the first request asks for the sampler's tokens (vLLM's ``logprobs``,
``return_token_ids``, ``return_tokens_as_token_ids``); a server that refuses those fields with 400/422
is asked without them from then on (``transformers serve`` rejects the vLLM ones). A request the server
refuses as too long for the model is a :class:`RequestRefused` (the caller stops that conversation).

Untrusted server: every request has a TOTAL deadline (``timeout``: connect, headers and body together;
httpx's own timeout is per read, so a server dripping one byte a second never trips it) and a response size
cap (``max_response_bytes``, :data:`DEFAULT_MAX_RESPONSE_BYTES`), both enforced while the body streams in: a
watchdog shuts the connection's socket at the deadline (connections are not kept alive, so each request's
socket is its own). The body is parsed as strict JSON (:mod:`echo_trl.io.strict_json`: no NaN/Infinity, no
number overflowing a float, no nesting too deep) and must be an object. A response that breaks these is a
:class:`BadResponse` (the caller ends that episode and goes on); ``Retry-After`` is read only as a plain
number of seconds (capped). The API key must be printable ASCII (checked before any request) and every
message this module writes passes through :func:`echo_trl.redact.redact`.

What the responses mean (turns, tool calls, token ids) is the caller's business: this module only
delivers them.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..errors import EchoTrlError
from ..io import strict_json
from ..redact import redact, register_secret

#: Request fields that ask vLLM for the sampler's token ids and per-token log-probs (its documented extras).
VLLM_TOKEN_FIELDS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}
LOGPROB_MODES = ("auto", "on", "off")
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
#: The default cap on one response body (decoded): a long turn with per-token log-probs is about 100 bytes a
#: token, so 16 MiB holds ~160k tokens; at --concurrency 32 the responses in flight stay under 512 MiB.
DEFAULT_MAX_RESPONSE_BYTES = 16 << 20
#: How much of an error response is read (its message is shown, never more).
ERROR_BODY_BYTES = 64 << 10
_RETRY_AFTER = re.compile(r"\d{1,9}(\.\d{1,6})?")
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


class BadResponse(ClientError):
    """One response cannot be used (over the size cap, not strict JSON, not an object): that episode stops (the
    reason noted in it), the run goes on."""


class Stopped(ClientError):
    """The run was stopped (Ctrl-C, SIGTERM): the request in flight was ended, no other is sent."""


class _Deadline(Exception):
    """The total deadline of one request passed (internal: becomes a retried problem)."""


def api_base(url: str) -> str:
    """The API base requests go under: ``URL`` as the OpenAI client takes it (``.../v1``); a bare
    ``http://host:port`` gets ``/v1``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ClientError(f"--policy openai:URL needs an http(s) URL, e.g. http://127.0.0.1:8000/v1; got {url!r}")
    return url.rstrip("/") + ("/v1" if parts.path in ("", "/") else "")


def retry_after_seconds(value: str | None, cap: float = 60.0) -> float | None:
    """``Retry-After`` as a number of seconds (at most ``cap``), or ``None`` when it is anything else (an HTTP
    date, ``nan``, ``inf``, ``1e400``, a negative number): then the client's own back-off applies."""
    if value is None or not _RETRY_AFTER.fullmatch(value.strip()):
        return None
    seconds = float(value.strip())
    return min(seconds, cap) if math.isfinite(seconds) else None


def backoff_seconds(attempt: int, base: float, retry_after: str | None = None, cap: float = 30.0) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): the server's ``Retry-After`` when it is a plain number
    (at most ``2 * cap``), else ``base * 2**attempt`` (capped), with up to 10% jitter so concurrent episodes do not
    retry in step."""
    server = retry_after_seconds(retry_after, 2 * cap)
    if server is not None:
        return server
    return min(base * 2**attempt, cap) * (1.0 + 0.1 * random.random())


def check_api_key(key: str | None, where: str = "the API key") -> None:
    """Refuse a key that cannot be sent in a header (not printable ASCII: a stray newline, a non-ASCII letter)
    without ever showing it."""
    if key is None:
        return
    bad = next((i for i, c in enumerate(key) if not 0x21 <= ord(c) <= 0x7E), None)
    if bad is not None:
        raise ClientError(
            f"{where} holds {'a non-ASCII' if ord(key[bad]) > 0x7E else 'a control or space'} character at position "
            f"{bad} of {len(key)} (a stray newline?): only printable ASCII can be sent in a header"
        )


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
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    key_source: str = "the API key"
    _token_fields: bool | None = field(default=None, repr=False)  # None: not known yet (auto)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stopped: threading.Event = field(default_factory=threading.Event, repr=False)
    _in_flight: set[Any] = field(default_factory=set, repr=False)  # what shuts each request's socket
    _in_flight_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    refusal: str = ""  # why the server gives no token ids (auto mode fell back)

    def __post_init__(self) -> None:
        import httpx

        if self.logprobs not in LOGPROB_MODES:
            raise ClientError(f"logprobs must be one of {', '.join(LOGPROB_MODES)}, got {self.logprobs!r}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ClientError(f"the request timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.max_retries < 0 or self.max_response_bytes < 1:
            raise ClientError("max_retries must be >= 0 and max_response_bytes >= 1")
        register_secret(self.api_key)
        check_api_key(self.api_key, self.key_source)
        self.base = api_base(self.url)
        self._token_fields = {"on": True, "off": False}.get(self.logprobs)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # no keep-alive: each request's socket is its own, so the deadline watchdog can shut it
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=0)
        self._http = httpx.Client(timeout=self.timeout, headers=headers, limits=limits, follow_redirects=False)

    def close(self) -> None:
        self._http.close()

    def stop(self) -> None:
        """End every request in flight at once and send no other (they raise :class:`Stopped`); from any thread.

        A stopped run must not wait for an inference server: a request may run to the total deadline (minutes)
        and be retried after it.
        """
        self._stopped.set()
        with self._in_flight_lock:
            shuts = list(self._in_flight)
        for shut in shuts:
            shut()

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
            self._check_stopped("no request sent")
            try:
                status, headers, data = self._send(where, body)
            except (_Deadline, httpx.TransportError) as exc:
                self._check_stopped("the request in flight was ended")
                if isinstance(exc, _Deadline):
                    problem = f"no complete response within the {self.timeout:g}s total deadline (--request_timeout)"
                else:
                    problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if status == 200:
                    return _json_object(data)
                detail = _detail(data)
                if status in RETRY_STATUS:
                    problem = f"HTTP {status}: {detail}"
                    retry_after = headers.get("retry-after")
                else:
                    if status == 400 and any(w in detail.lower() for w in _CONTEXT_WORDS):
                        raise RequestRefused(f"the server refused the request as too long: {detail}")
                    raise InferenceServerError(
                        f"inference server {where} answered HTTP {status}: {detail}", status=status, detail=detail
                    )
            if attempt < self.max_retries:
                self._stopped.wait(backoff_seconds(attempt, self.backoff, retry_after))  # stop() ends the wait
        raise InferenceServerError(
            redact(f"inference server {where} still failing after {self.max_retries + 1} tries: {problem}")
        )

    def _check_stopped(self, what: str) -> None:
        if self._stopped.is_set():
            raise Stopped(f"the run was stopped: {what}")

    def _send(self, where: str, body: dict[str, Any]) -> tuple[int, Any, bytes]:
        """One POST: (status, headers, body bytes), the whole exchange within ``timeout`` and the body within
        ``max_response_bytes`` (an error body: its first :data:`ERROR_BODY_BYTES`). A watchdog shuts the socket
        at the deadline, which ends any read in progress (headers that never end, a dripping body)."""
        deadline = time.monotonic() + self.timeout
        sockets: list[Any] = []
        expired = threading.Event()

        def shut() -> None:
            expired.set()
            for stream in sockets:
                _shutdown(stream)

        def trace(name: str, info: dict[str, Any]) -> None:
            if name == "connection.connect_tcp.complete":
                sockets.append(info.get("return_value"))
                if expired.is_set():
                    shut()

        timer = threading.Timer(self.timeout, shut)
        timer.daemon = True
        timer.start()
        with self._in_flight_lock:
            self._in_flight.add(shut)
        if self._stopped.is_set():  # stop() ran before this request registered: its socket is shut on connect
            shut()
        try:
            with self._http.stream("POST", where, json=body, extensions={"trace": trace}) as r:
                limit = self.max_response_bytes if r.status_code == 200 else ERROR_BODY_BYTES
                chunks, size = [], 0
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > limit:
                        if r.status_code != 200:
                            break
                        raise BadResponse(
                            f"the server's response is over {limit} bytes (--max_response_bytes): not read further"
                        )
                    chunks.append(chunk)
                    if time.monotonic() > deadline:
                        raise _Deadline
                return r.status_code, r.headers, b"".join(chunks)[:limit]
        except Exception:
            if expired.is_set():
                raise _Deadline from None
            raise
        finally:
            timer.cancel()
            with self._in_flight_lock:
                self._in_flight.discard(shut)


def _shutdown(stream: Any) -> None:
    """Shut the socket under an httpcore network stream (ends a blocked read at once); gone already: nothing."""
    with contextlib.suppress(Exception):
        import socket

        stream.get_extra_info("socket").shutdown(socket.SHUT_RDWR)


def _json_object(data: bytes) -> dict[str, Any]:
    """A 200 body as a JSON object, strictly (see the module docstring), else :class:`BadResponse`."""
    try:
        value = strict_json.loads(data)
    except strict_json.StrictJSONError as exc:
        raise BadResponse(redact(f"the server's response is not strict JSON: {exc}")) from None
    if not isinstance(value, dict):
        raise BadResponse(f"the server's response is a JSON {type(value).__name__}, not an object")
    return value


def _detail(data: bytes) -> str:
    """The server's error message (OpenAI's ``{"error": {"message"}}``, FastAPI's ``{"detail"}``), one line,
    redacted (a body may quote the request's ``Authorization`` header)."""
    try:
        value: Any = strict_json.loads(data)
    except strict_json.StrictJSONError:
        value = data.decode("utf-8", errors="replace")
    if isinstance(value, dict):
        value = value.get("error", value.get("detail", value))
        if isinstance(value, dict):
            value = value.get("message", value)
    return redact(" ".join(str(value).split()))[:300]
