"""Scenario server bootstrap, run inside the sandbox: ``python -I _serve.py APP SNAPSHOT LISTEN READY CONTROL``.

Never imported by echo_trl. Every argument is a descriptor the host passed, nothing is a host
path: APP and SNAPSHOT are sealed (unwritable) memfds holding the generated code and the initial
database; LISTEN is the Unix socket the host bound and listens on; READY a pipe; CONTROL a socket.

The episode database lives in the sandbox's own tmpfs (``live.db`` in the working directory),
copied from SNAPSHOT at start. The generated FastAPI code runs as a module (not as
``__main__``, so its own ``uvicorn.run`` block stays off) with every SQLAlchemy engine pointed at
that database (``create_engine`` is wrapped, so hard-coded URLs and ``DATABASE_PATH`` both work);
fastapi-mcp mounts the MCP server (streamable HTTP at ``/mcp``; tool name = route
``operation_id``) and uvicorn serves it on LISTEN. Once uvicorn listens, one byte ``R`` goes to
READY. A daemon thread answers the host's database requests on CONTROL, one at a time:

    request: op (1 byte) + id (8) + payload length (8, big-endian) + payload
    reply:   status (``K`` ok / ``E`` error, 1 byte) + the request's id (8) + length (8) + payload

``S`` save: reply with the live database's bytes; ``L`` load: replace the live database's content
with the payload (an image); ``R`` reset: replace it with SNAPSHOT's. Copies use SQLite's backup
API, so the server's own open connections see the new state at their next transaction. The host
treats every reply as untrusted (the generated code shares this process): bounded, with a deadline.
"""

import contextlib
import os
import socket
import sqlite3
import sys
import threading
import warnings

HEADER = 17


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _replace(db_path, source):
    with contextlib.closing(sqlite3.connect(db_path, timeout=10)) as target:
        source.backup(target)


def _load(db_path, image):
    with contextlib.closing(sqlite3.connect(":memory:")) as source:
        source.deserialize(image)
        _replace(db_path, source)


def _answer(op, payload, db_path, snapshot_fd):
    if op == b"S":
        with contextlib.closing(sqlite3.connect(db_path, timeout=10)) as conn:
            return conn.serialize()
    if op == b"L":
        _load(db_path, payload)
        return b""
    if op == b"R":
        _load(db_path, _read_all(snapshot_fd))
        return b""
    raise ValueError(f"unknown request {op!r}")


def _read_all(fd):
    return os.pread(fd, os.fstat(fd).st_size, 0)


def serve_control(fd, db_path, snapshot_fd):
    sock = socket.socket(fileno=fd)
    while True:
        head = _recv_exact(sock, HEADER)
        if head is None:
            return
        op, rid, size = head[:1], head[1:9], int.from_bytes(head[9:], "big")
        payload = _recv_exact(sock, size) if size else b""
        if payload is None:
            return
        try:
            status, body = b"K", _answer(op, payload, db_path, snapshot_fd)
        except Exception as exc:
            status, body = b"E", f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:4000]
        sock.sendall(status + rid + len(body).to_bytes(8, "big") + body)


def main():
    app_fd, snapshot_fd, listen_fd, ready_fd, control_fd = (int(a) for a in sys.argv[1:6])
    db_path = os.path.join(os.getcwd(), "live.db")
    _load(db_path, _read_all(snapshot_fd))
    threading.Thread(target=serve_control, args=(control_fd, db_path, snapshot_fd), daemon=True).start()

    url = f"sqlite:///{db_path}"
    os.environ["DATABASE_PATH"] = url
    os.environ["DATABASE_URL"] = url
    warnings.simplefilter("ignore")

    import sqlalchemy
    import sqlalchemy.engine

    original = sqlalchemy.create_engine

    def create_engine(*args, **kwargs):
        connect_args = dict(kwargs.pop("connect_args", None) or {})
        connect_args["check_same_thread"] = False
        return original(url, connect_args=connect_args, **kwargs)

    sqlalchemy.create_engine = create_engine
    sqlalchemy.engine.create_engine = create_engine

    code_path = os.path.join(os.getcwd(), "app.py")  # its name in tracebacks; the code itself is never on disk
    code = _read_all(app_fd).decode("utf-8")
    os.close(app_fd)
    namespace = {"__name__": "awm_scenario_app", "__file__": code_path}
    exec(compile(code, code_path, "exec"), namespace)

    from fastapi import FastAPI

    app = namespace.get("app")
    if not isinstance(app, FastAPI):
        apps = [v for v in namespace.values() if isinstance(v, FastAPI)]
        if not apps:
            sys.stderr.write("echo-trl: the scenario code defines no FastAPI app\n")
            sys.exit(3)
        app = apps[0]

    from fastapi_mcp import FastApiMCP

    FastApiMCP(app).mount_http()

    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:
                with contextlib.suppress(OSError):
                    os.write(ready_fd, b"R")
                    os.close(ready_fd)

    sys.stderr.write("echo-trl: serving\n")
    config = uvicorn.Config(app, fd=listen_fd, log_level="warning", access_log=False, timeout_graceful_shutdown=1)
    Server(config).run()


if __name__ == "__main__":
    main()
