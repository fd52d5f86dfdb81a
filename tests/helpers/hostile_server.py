"""A hostile OpenAI-compatible server on loopback: one stdlib ``http.server`` in a thread, a mode per URL.

The mode is the first path segment: ``openai:{server.url('nan_logprob')}`` posts to
``/nan_logprob/v1/chat/completions``, so each test (and each capture) picks its case without shared state;
``a+b+c`` answers the n-th request with the n-th mode, so one capture (episodes played one at a time) meets
several cases.
Every mode answers a well-formed chat completion (a final answer, ``ANSWER``, with the token ids given to
the server: the trainer's own, so a mode that only spoils one field would otherwise align) and then breaks
one thing, as an adversarial or buggy server would (issue 32). ``MODES`` lists them with what they send.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = "Done."

#: mode -> what the server does (the docs' table of hostile-server cases follows this list).
MODES = {
    "ok": "a valid completion: the trainer's token ids, log-probs -0.5",
    "nan_logprob": "log-prob NaN (bare JSON NaN)",
    "inf_logprob": "log-prob Infinity",
    "overflow_logprob": "log-prob 1e400 (overflows a float)",
    "tiny_logprob": "log-prob -1e30 (finite, below the floor)",
    "positive_logprob": "log-prob +50",
    "huge_digits_logprob": "log-prob a 401-digit integer",
    "nan_argument": 'a tool call whose arguments object holds {"query": NaN}',
    "negative_token_id": "token id -1",
    "huge_token_id": "token id 2^63",
    "outside_vocab_token_id": "token id 10^9 (outside any vocabulary, below 2^31)",
    "word_token_id": 'a "token_id:abc" token',
    "surrogate_content": "a lone surrogate (\\ud800) in the answer",
    "tool_calls_int": '"tool_calls": 5',
    "deep_json": "a body nested 100,000 arrays deep",
    "list_body": "a JSON array, not an object",
    "big_arguments": "a tool call with 3 MB of arguments (over the 2M-character rendered bound)",
    "big_body": "a 300 MB body (Content-Length, streamed)",
    "endless_chunked": "a chunked body that never ends",
    "drip": "a valid body sent 1 byte a second",
    "endless_headers": "headers that never end (one a second)",
    "unauthorized": "HTTP 401 whose body quotes the Authorization header",
    "retry_after_nan": "HTTP 429 with Retry-After: nan, then valid",
    "not_json": "HTTP 200 with an HTML body",
}


def completion(token_ids: list[int], *, content: str = ANSWER, logprob: Any = -0.5, **extra: Any) -> dict[str, Any]:
    """A chat completion with vLLM's token fields: ``token_ids`` and one ``logprob`` per token."""
    entries = [{"token": f"token_id:{t}", "logprob": logprob, "top_logprobs": []} for t in token_ids]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
        "logprobs": {"content": entries},
        "token_ids": list(token_ids),
    }
    choice.update(extra)
    return {"id": "x", "object": "chat.completion", "choices": [choice], "usage": {"prompt_tokens": 1}}


class HostileServer:
    """The server (see the module docstring); ``token_ids``: the ids of ``ANSWER`` as the trainer tokenizes the
    assistant turn. ``requests`` counts requests per mode; ``authorization`` keeps the last header seen."""

    def __init__(self, token_ids: list[int]):
        self.token_ids = list(token_ids)
        self.requests: dict[str, int] = {}
        self.authorization = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                mode = self.path.strip("/").split("/")[0]
                with server._lock:
                    server.requests[mode] = server.requests.get(mode, 0) + 1
                    count = server.requests[mode]
                    server.authorization = self.headers.get("authorization", "")
                if "+" in mode:  # a sequence: the n-th request gets the n-th mode (cycling)
                    modes = mode.split("+")
                    mode = modes[(count - 1) % len(modes)]
                with contextlib.suppress(OSError):  # the client hung up: what these modes are for
                    server._answer(self, mode, count)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- the modes -----------------------------------------------------------------------------------

    def _send(self, h: BaseHTTPRequestHandler, body: bytes | str, status: int = 200, **headers: str) -> None:
        data = body.encode() if isinstance(body, str) else body
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        for k, v in headers.items():
            h.send_header(k.replace("_", "-"), v)
        h.end_headers()
        h.wfile.write(data)

    def _answer(self, h: BaseHTTPRequestHandler, mode: str, count: int) -> None:
        ids = self.token_ids
        ok = json.dumps(completion(ids))
        logprob_text = {
            "nan_logprob": "NaN",
            "inf_logprob": "Infinity",
            "overflow_logprob": "1e400",
            "tiny_logprob": "-1e30",
            "positive_logprob": "50.0",
            "huge_digits_logprob": "-" + "9" * 401,
        }
        if mode in logprob_text:  # written as text: json.dumps cannot write most of these
            return self._send(h, ok.replace('"logprob": -0.5', f'"logprob": {logprob_text[mode]}', 1))
        if mode == "ok":
            return self._send(h, ok)
        if mode in ("nan_argument", "big_arguments", "tool_calls_int"):
            args = {"query": "x" * (3 << 20)} if mode == "big_arguments" else {"query": 1.0}
            calls: Any = (
                5
                if mode == "tool_calls_int"
                else [{"id": "c0", "type": "function", "function": {"name": "search_members", "arguments": args}}]
            )
            body = completion(ids)
            body["choices"][0]["message"] = {"role": "assistant", "content": "", "tool_calls": calls}
            text = json.dumps(body)
            return self._send(h, text.replace('"query": 1.0', '"query": NaN') if mode == "nan_argument" else text)
        if mode in ("negative_token_id", "huge_token_id", "outside_vocab_token_id"):
            bad = {"negative_token_id": -1, "huge_token_id": 2**63, "outside_vocab_token_id": 10**9}[mode]
            return self._send(h, json.dumps(completion([bad, *ids[1:]])))
        if mode == "word_token_id":
            word = ok.replace(f'"token_id:{ids[0]}"', '"token_id:abc"', 1)
            return self._send(h, word.replace('"token_ids": [', '"x": ['))  # ids from the tokens only
        if mode == "surrogate_content":
            return self._send(h, ok.replace(json.dumps(ANSWER), '"Do\\ud800ne."', 1))
        if mode == "deep_json":
            return self._send(h, "[" * 100_000 + "]" * 100_000)
        if mode == "list_body":
            return self._send(h, "[" + ok + "]")
        if mode == "not_json":
            return self._send(h, "<html>Bad gateway</html>")
        if mode == "big_body":
            return self._stream(h, (b" " * (1 << 20) for _ in range(300)), length=300 << 20)
        if mode == "endless_chunked":
            return self._stream(h, iter(lambda: b" " * (1 << 16), None), length=None)
        if mode == "drip":
            return self._stream(h, (bytes([c]) for c in ok.encode()), length=len(ok.encode()), pause=1.0)
        if mode == "endless_headers":
            h.wfile.write(b"HTTP/1.1 200 OK\r\n")
            for i in range(10_000):
                if self._stop.wait(1.0):
                    return
                h.wfile.write(f"x-slow-{i}: {'y' * 8}\r\n".encode())
                h.wfile.flush()
            return None
        if mode == "unauthorized":
            quoted = json.dumps({"error": {"message": f"invalid key; you sent Authorization: {self.authorization}"}})
            return self._send(h, quoted, status=401)
        if mode == "retry_after_nan":
            if count == 1:
                return self._send(h, json.dumps({"error": {"message": "slow down"}}), status=429, retry_after="nan")
            return self._send(h, ok)
        return self._send(h, json.dumps({"error": {"message": f"unknown mode {mode}"}}), status=404)

    def _stream(self, h: BaseHTTPRequestHandler, chunks, *, length: int | None, pause: float = 0.0) -> None:
        h.send_response(200)
        h.send_header("content-type", "application/json")
        if length is None:
            h.send_header("transfer-encoding", "chunked")
        else:
            h.send_header("content-length", str(length))
        h.end_headers()
        t0 = time.monotonic()
        for chunk in chunks:
            if self._stop.is_set() or time.monotonic() - t0 > 600:
                return
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if length is None else chunk)
            h.wfile.flush()
            if pause and self._stop.wait(pause):
                return
