"""A synchronous MCP client session over a Unix socket (the real protocol: ``mcp``'s client).

One :class:`MCPSession` per episode: connect + initialize once, then ``list_tools`` /
``call_tool``. The asyncio side runs on one shared daemon event-loop thread, so callers (the
capture loop, TRL's tool loop) stay synchronous. Every call has a deadline and can be abandoned
early when the server process dies (``alive`` callback), so a crashed or hung server becomes an
error, never a hang. Every HTTP response body is counted as it arrives and cut at
:data:`MAX_REPLY_BYTES`: a server that answers with gigabytes costs the host one cap's worth of
memory, and the call fails at once with :class:`ReplyTooLarge`. A reply the ``mcp`` library cannot
parse (invalid UTF-8, a lone surrogate, nesting too deep for its JSON parser) is logged by that library
with a traceback and then dropped, leaving the call to wait for its deadline: the log record is taken
instead (:class:`_MalformedReplies`), so the call fails at once with :class:`MalformedReply` and nothing
is printed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MCP_URL = "http://awm-scenario/mcp"
MAX_REPLY_BYTES = 4 << 20  # one HTTP response (a tool reply and its JSON-RPC wrapping)


class MCPError(RuntimeError):
    """The MCP transport failed (server gone, timeout, protocol error): not a tool's own error."""


class ReplyTooLarge(MCPError):
    """The server's reply went over the cap on reply size; the rest was not read."""


class CallTimedOut(MCPError):
    """A call got no reply within its timeout: the server may still be working on it (the caller stops it)."""


class MalformedReply(MCPError):
    """The server's reply could not be parsed as an MCP message (it was dropped by the client library)."""


#: The session whose asyncio task (and the ``mcp`` tasks it starts, which inherit its context) is running.
_SESSION: contextvars.ContextVar[MCPSession | None] = contextvars.ContextVar("echo_trl_mcp_session", default=None)

#: ``mcp`` loggers that report a reply they could not parse (``logger.exception``) before dropping it.
MCP_PARSE_LOGGERS = ("mcp.client.streamable_http", "mcp.shared.session", "mcp.client.session")


class _MalformedReplies(logging.Filter):
    """Turns the ``mcp`` library's logged parse failures into the failure of the session they happened in.

    The library logs the exception with its traceback and drops the reply, so the request would wait for its
    deadline; instead the session records a :class:`MalformedReply` that the waiting call raises at once, and
    the record is not printed. Records from outside an echo-trl session pass through unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        session = _SESSION.get()
        if session is None or record.levelno < logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        detail = _describe(exc) if exc is not None else record.getMessage()
        detail = " ".join(detail.split())
        session._failure = MalformedReply(f"malformed reply from the scenario server ({detail[:300]})")
        return False


@functools.cache
def _install_malformed_reply_filter() -> None:
    for name in MCP_PARSE_LOGGERS:
        logging.getLogger(name).addFilter(_MalformedReplies())


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool call returned: ``is_error`` is MCP's ``isError`` (the tool failed), text is its content."""

    text: str
    is_error: bool


@functools.cache
def _capped_transport_class() -> type:
    """httpx's Unix-socket transport with every response body counted and cut at a cap (httpx loads lazily)."""
    import httpx

    class CappedStream(httpx.AsyncByteStream):
        def __init__(self, inner: httpx.AsyncByteStream, cap: int, exceeded: Callable[[int], None]):
            self.inner, self.cap, self.exceeded = inner, cap, exceeded

        async def __aiter__(self):
            total = 0
            async for chunk in self.inner:
                total += len(chunk)
                if total > self.cap:
                    self.exceeded(total)
                    raise ReplyTooLarge(f"the reply exceeded the {self.cap}-byte cap on tool replies (discarded)")
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class CappedTransport(httpx.AsyncBaseTransport):
        def __init__(self, socket_path: str, cap: int, exceeded: Callable[[int], None]):
            self.inner = httpx.AsyncHTTPTransport(uds=socket_path)
            self.cap, self.exceeded = cap, exceeded

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            response = await self.inner.handle_async_request(request)
            return httpx.Response(
                status_code=response.status_code,
                headers=response.headers,
                stream=CappedStream(response.stream, self.cap, self.exceeded),  # type: ignore[arg-type]
                extensions=response.extensions,
            )

        async def aclose(self) -> None:
            await self.inner.aclose()

    return CappedTransport


class _Loop:
    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                loop.set_exception_handler(_quiet_handler)
                threading.Thread(target=loop.run_forever, name="echo-trl-mcp-loop", daemon=True).start()
                cls._loop = loop
            return cls._loop


def _quiet_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Drop asyncio's noise about futures of sessions abandoned at shutdown; log the rest."""
    if isinstance(context.get("exception"), asyncio.InvalidStateError | asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def _wait(
    fut: concurrent.futures.Future,
    timeout: float,
    alive: Callable[[], bool] | None,
    what: str,
    failure: Callable[[], MCPError | None] = lambda: None,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            fut.cancel()
            raise CallTimedOut(f"{what} timed out after {timeout:g}s")
        try:
            return fut.result(timeout=min(0.1, remaining))
        except concurrent.futures.TimeoutError:
            error = failure()
            if error is not None:  # the transport gave up on a reply the client would otherwise wait for
                fut.cancel()
                raise type(error)(f"{what} failed: {error}") from None
            if alive is not None and not alive():
                fut.cancel()
                raise MCPError(f"{what} failed: the scenario server exited") from None
        except concurrent.futures.CancelledError:
            raise MCPError(f"{what} was cancelled") from None


class MCPSession:
    """An initialized MCP client session to the server listening on ``socket_path``."""

    def __init__(
        self,
        socket_path: str,
        *,
        timeout: float = 30.0,
        alive: Callable[[], bool] | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        self.socket_path, self.timeout, self.alive = socket_path, timeout, alive
        self.max_reply_bytes = max_reply_bytes
        self._failure: MCPError | None = None
        self._session = None
        self._closed: asyncio.Event | None = None
        self._owner: concurrent.futures.Future | None = None
        self.loop = _Loop.get()

    # The session lives inside one task (anyio contexts must be exited where they were entered).
    async def _own(self, ready: asyncio.Future) -> None:
        import httpx
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        self._closed = asyncio.Event()
        _install_malformed_reply_filter()
        _SESSION.set(self)  # this task's context, inherited by the tasks the mcp client starts in it
        try:
            transport = _capped_transport_class()(self.socket_path, self.max_reply_bytes, self._reply_too_large)
            async with (
                httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(self.timeout)) as http,
                streamable_http_client(MCP_URL, http_client=http) as (read, write, _),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                self._session = session
                ready.set_result(True)
                await self._closed.wait()
        except BaseException as exc:  # noqa: BLE001 - reported through `ready` or swallowed at close
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else MCPError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._session = None

    def _reply_too_large(self, received: int) -> None:
        self._failure = ReplyTooLarge(
            f"the reply exceeded the {self.max_reply_bytes}-byte cap on tool replies ({received} bytes received, "
            "discarded)"
        )

    def _take_failure(self) -> MCPError | None:
        error, self._failure = self._failure, None
        return error

    #: A server that has just started can answer its first MCP initialize with HTTP 500 although it already
    #: accepts connections (seen after restarts under load): retried briefly while the server is alive.
    STARTUP_RETRIES, STARTUP_DELAY = 4, 0.25

    def open(self) -> MCPSession:
        """Connect and initialize; an HTTP 5xx from a live server is retried (:data:`STARTUP_RETRIES`)."""
        for attempt in range(self.STARTUP_RETRIES + 1):
            try:
                return self._open_once()
            except MCPError as exc:
                alive = self.alive is None or self.alive()
                if not (getattr(exc, "server_error", False) and alive) or attempt == self.STARTUP_RETRIES:
                    raise
                time.sleep(self.STARTUP_DELAY * (attempt + 1))
        raise AssertionError("unreachable")

    def _open_once(self) -> MCPSession:
        async def start():
            ready = asyncio.get_running_loop().create_future()
            self._task = asyncio.ensure_future(self._own(ready))
            await ready

        fut = asyncio.run_coroutine_threadsafe(start(), self.loop)
        try:
            _wait(fut, self.timeout, self.alive, "MCP connect + initialize", self._take_failure)
        except MCPError:
            self.close()
            raise
        except Exception as exc:
            self.close()
            error = MCPError(f"MCP connect + initialize failed: {_describe(exc)}")
            error.server_error = _server_error(exc)
            raise error from None
        return self

    def _call(self, coro_fn, what: str, timeout: float | None) -> Any:
        if self._session is None:
            raise MCPError(f"{what}: the MCP session is not open")
        session = self._session

        async def run():
            return await coro_fn(session)

        fut = asyncio.run_coroutine_threadsafe(run(), self.loop)
        try:
            return _wait(fut, timeout or self.timeout, self.alive, what, self._take_failure)
        except MCPError:
            raise
        except Exception as exc:
            raise MCPError(f"{what} failed: {_describe(exc)}") from None

    def list_tools(self) -> list[dict[str, Any]]:
        """Every tool as a full MCP tool object ``{name, description, inputSchema}``."""

        async def run(session):
            tools, cursor = [], None
            while True:
                page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
                tools += page.tools
                cursor = page.nextCursor
                if not cursor:
                    return tools

        tools = self._call(run, "tools/list", None)
        return [
            {"name": t.name, "description": t.description or "", "inputSchema": t.inputSchema or {}} for t in tools
        ]

    def call_tool(self, name: str, arguments: dict[str, Any], *, timeout: float | None = None) -> ToolOutcome:
        """Call one tool; a tool-level failure is ``is_error=True``, a transport failure raises MCPError."""

        async def run(session):
            return await session.call_tool(name, arguments)

        result = self._call(run, f"tools/call {name}", timeout)
        parts = []
        for c in result.content:
            text = getattr(c, "text", None)
            parts.append(text if isinstance(text, str) else json.dumps(c.model_dump(mode="json"), ensure_ascii=False))
        return ToolOutcome("\n".join(parts), bool(result.isError))

    def close(self, timeout: float = 3.0) -> None:
        """End the session (best effort when the server is already gone); never raises."""
        closed, task = self._closed, getattr(self, "_task", None)
        self._session = None
        if closed is not None:
            self.loop.call_soon_threadsafe(closed.set)
        if task is not None:

            async def finish():
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(task), timeout)
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(finish(), self.loop).result(timeout + 2.0)
        self._closed, self._task = None, None

    def __enter__(self) -> MCPSession:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def _server_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or any exception in an anyio ExceptionGroup) is an HTTP 5xx answer."""
    inner = getattr(exc, "exceptions", None)
    if inner:
        return any(_server_error(e) for e in inner)
    return getattr(getattr(exc, "response", None), "status_code", 0) >= 500


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)  # ExceptionGroup from anyio task groups
    if inner:
        return "; ".join(_describe(e) for e in inner)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
