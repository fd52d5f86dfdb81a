"""The MCP client against a hijacked server: replies no MCP parser accepts end the call at once, quietly.

A minimal streamable-HTTP MCP server on a Unix socket answers ``initialize`` properly and ``tools/call``
with bytes a compromised scenario server could send: invalid UTF-8, a lone surrogate, nesting deeper than
any JSON parser follows. The real ``mcp`` client library parses them.
"""

from __future__ import annotations

import json
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from echo_trl.clients.mcp import MalformedReply, MCPError, MCPSession

#: tools/call reply bodies (application/json), each a JSON-RPC response in form only.
MALFORMED = {
    "invalid_utf8": b'{"jsonrpc": "2.0", "id": ID, "result": {"content": [{"type": "text", "text": "\xff\xfe"}]}}',
    "lone_surrogate": b'{"jsonrpc": "2.0", "id": ID, "result": {"content": [{"type": "text", "text": "\\ud800"}]}}',
    "deep_nesting": b'{"jsonrpc": "2.0", "id": ID, "result": {"content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "invalid_utf8"

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # no server-initiated stream
        self._send(405)

    def do_DELETE(self):
        self._send(200)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in request:  # a notification
            self._send(202)
        elif request["method"] == "initialize":
            result = {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hijacked", "version": "1"},
            }
            self._send(200, json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode())
        elif request["method"] == "tools/list":  # the client lists the tools before its first call
            tools = [{"name": n, "inputSchema": {"type": "object"}} for n in ("good", "probe")]
            self._send(200, json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": {"tools": tools}}).encode())
        elif request["method"] == "tools/call" and request["params"]["name"] == "good":
            result = {"content": [{"type": "text", "text": "fine"}], "isError": False}
            self._send(200, json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode())
        else:
            self._send(200, MALFORMED[self.mode].replace(b"ID", str(request["id"]).encode()))


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        request, _ = super().get_request()
        return request, ("unix", 0)  # BaseHTTPRequestHandler expects a (host, port) client address

    def handle_error(self, request, client_address):
        # The client hangs up on a malformed reply, sometimes while this server still answers a notification
        # sent before it: that is the client working, not the server failing. Anything else is still printed.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def hijacked(tmp_path):
    path = str(tmp_path / "mcp.sock")
    server = _Server(path, _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield path
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("mode", sorted(MALFORMED))
def test_a_malformed_reply_ends_the_call_at_once_without_a_traceback(hijacked, mode, monkeypatch, capfd):
    monkeypatch.setattr(_Handler, "mode", mode)
    timeout = 20.0
    with MCPSession(hijacked, timeout=timeout) as session:
        assert session.call_tool("good", {}).text == "fine"  # the server speaks MCP
        start = time.monotonic()
        with pytest.raises(MalformedReply, match="malformed reply from the scenario server") as info:
            session.call_tool("probe", {"q": 1})
        elapsed = time.monotonic() - start
    assert isinstance(info.value, MCPError)  # what the episode turns into an error observation
    assert elapsed < timeout / 4, f"{mode}: the call took {elapsed:.1f}s of its {timeout:g}s timeout"
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error parsing" not in err, err
