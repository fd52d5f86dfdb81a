"""One scenario server: the generated FastAPI app + MCP, in a contained subprocess on a Unix socket.

A Unix socket needs no port (no races between parallel servers) and still works from inside a
network namespace with no interfaces, so the server can run with its network cut.

Nothing the server can write is ever a path the host uses. The host binds and listens on the
socket itself, in its own private run directory (0700), and passes the listening descriptor in;
the generated code, the database snapshot, readiness and the database's bytes all cross as
descriptors (see ``_serve.py``): sealed memfds in, a pipe for "ready", a socket for database
requests whose replies are bounded and have a deadline. The log is a file the host created in
its run directory; the server gets it as stdout, the host reads its tail through its own
descriptor. The live database exists only in the sandbox's tmpfs and dies with it.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ....errors import EchoTrlError
from ....sandbox import bwrap, hostio
from ..scenario.database import MAX_IMAGE_BYTES
from ..scenario.source import Scenario, ScenarioError

SERVE = str(Path(__file__).with_name("_serve.py"))
MAX_SOCKET_PATH = 107  # sun_path limit on Linux, minus the NUL
LOG_KEPT_ON_RESTART = 16 << 10
_HEADER = 17


class DatabaseUnavailable(EchoTrlError):
    """The live database could not be saved, loaded or reset through the scenario server."""


class ScenarioServer:
    """Start/stop the scenario's server over a fresh copy of ``snapshot`` (an image); files in ``run_dir``."""

    def __init__(
        self,
        scenario: Scenario,
        run_dir: Path,
        snapshot: bytes,
        *,
        containment: bwrap.Containment | None = None,
        start_timeout: float = 60.0,
        control_timeout: float = 30.0,
        limits: bwrap.Limits = bwrap.SERVER_LIMITS,
    ):
        self.scenario, self.run_dir, self.snapshot = scenario, Path(run_dir), snapshot
        self.socket_path = str(self.run_dir / "mcp.sock")
        self.log_path = self.run_dir / "server.log"
        self.containment, self.limits = containment, limits
        self.start_timeout, self.control_timeout = start_timeout, control_timeout
        self.proc = None
        self.start_seconds: float | None = None
        self._log_fd: int | None = None
        self._control: socket.socket | None = None
        self._control_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> float:
        """Start the server and wait until it says it listens; returns seconds taken."""
        code = self.scenario.require("env_code")
        if len(self.socket_path) > MAX_SOCKET_PATH:
            raise ScenarioError(
                f"socket path too long for a Unix socket ({len(self.socket_path)} chars): "
                f"{self.socket_path}; set TMPDIR to a shorter directory",
                scenario=self.scenario.name,
            )
        self.stop()
        if self._log_fd is None:
            self._log_fd = os.open(
                self.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            hostio.check_regular(self._log_fd, str(self.log_path))
        else:  # a restart: keep the end of the last server's log, so the file-size cap is this start's again
            tail = hostio.read_tail(self._log_fd, LOG_KEPT_ON_RESTART)
            os.ftruncate(self._log_fd, 0)
            os.write(self._log_fd, tail + b"\n--- echo-trl: server restarted ---\n")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # our own socket of an earlier start: the run dir is private
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ready_r, ready_w = os.pipe()
        host_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = [ready_w, server_end.fileno(), listener.fileno()]
        t0 = time.perf_counter()
        try:
            listener.bind(self.socket_path)
            listener.listen(128)
            fds += [hostio.sealed_memfd(code.encode("utf-8"), "app.py")]
            fds += [hostio.sealed_memfd(self.snapshot, "snapshot.db")]
            app_fd, snapshot_fd = fds[3], fds[4]
            self.proc = bwrap.spawn(
                [sys.executable, "-I", SERVE, *map(str, (app_fd, snapshot_fd, listener.fileno(), ready_w, fds[1]))],
                readonly=[SERVE],
                fds=fds,
                stdout=self._log_fd,
                limits=self.limits,
                containment=self.containment,
            )
        except BaseException:
            host_end.close()
            os.close(ready_r)
            raise
        finally:
            for fd in (ready_w, *fds[3:]):
                os.close(fd)
            server_end.close()
            listener.close()
        self._control = host_end
        try:
            self._wait_ready(ready_r)
        finally:
            os.close(ready_r)
        self.start_seconds = time.perf_counter() - t0
        return self.start_seconds

    def _wait_ready(self, ready_r: int) -> None:
        """Wait for the one byte the server writes once uvicorn listens (never a file it could replace)."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                self.stop()
                raise ScenarioError(
                    f"the scenario server exited during start-up (exit code {rc}); server log:\n{self.log_tail()}",
                    scenario=self.scenario.name,
                    source=self.scenario.sources.get("env_code", ""),
                    field="full_code",
                )
            if select.select([ready_r], [], [], 0.02)[0]:
                signal_byte = os.read(ready_r, 1)
                if signal_byte == b"R":
                    return
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=1.0)  # an exit closes the pipe too: report the exit if that is it
                if self.proc.poll() is not None:
                    continue
                self.stop()  # whatever runs there is not a started server
                what = f"wrote {signal_byte!r} to" if signal_byte else "closed"
                raise ScenarioError(
                    f"the scenario server {what} its readiness pipe without starting; server log:\n{self.log_tail()}",
                    scenario=self.scenario.name,
                    field="full_code",
                )
        self.stop()
        raise ScenarioError(
            f"the scenario server did not start within {self.start_timeout:g}s; server log:\n{self.log_tail()}",
            scenario=self.scenario.name,
            field="full_code",
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_description(self) -> str:
        if self.proc is None:
            return "the scenario server is not running"
        rc = self.proc.poll()
        if rc is None:
            return "the scenario server is running"
        how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
        return f"the scenario server exited ({how})"

    def log_tail(self, limit: int = 3000) -> str:
        """The end of the server's log, read through the host's own descriptor of the file it created."""
        if self._log_fd is None:
            return ""
        return hostio.read_tail(self._log_fd, limit).decode("utf-8", errors="replace")

    def stop(self) -> None:
        bwrap.kill_tree(self.proc)
        with self._control_lock:
            if self._control is not None:
                self._control.close()
                self._control = None

    def close(self) -> None:
        """Stop the server and release the log descriptor; idempotent."""
        self.stop()
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    # -- the live database -------------------------------------------------------------------

    def save_database(self) -> bytes:
        """The live database's bytes (a consistent image, at most :data:`MAX_IMAGE_BYTES`)."""
        return self._request(b"S")

    def load_database(self, image: bytes) -> None:
        """Replace the live database's content with ``image`` (the server's connections see it next)."""
        self._request(b"L", image)

    def reset_database(self) -> None:
        """Put the live database back to the snapshot the server started from."""
        self._request(b"R")

    def _request(self, op: bytes, payload: bytes = b"") -> bytes:
        what = {b"S": "saving", b"L": "loading", b"R": "resetting"}[op]
        with self._control_lock:
            sock = self._control
            if sock is None or not self.alive():
                raise DatabaseUnavailable(f"{what} the live database: {self.exit_description()}")
            rid = os.urandom(8)
            deadline = time.monotonic() + self.control_timeout
            try:
                sock.sendall(op + rid + len(payload).to_bytes(8, "big") + payload)
                head = _recv_exact(sock, _HEADER, deadline)
                status, size = head[:1], int.from_bytes(head[9:], "big")
                if head[1:9] != rid or status not in (b"K", b"E"):
                    raise DatabaseUnavailable("the server's reply is out of step with the request")
                if size > MAX_IMAGE_BYTES:
                    raise DatabaseUnavailable(f"the server's reply is {size} bytes, over the {MAX_IMAGE_BYTES} cap")
                body = _recv_exact(sock, size, deadline)
            except (OSError, DatabaseUnavailable) as exc:
                sock.close()  # out of step from here on: no later request may read this reply
                self._control = None
                raise DatabaseUnavailable(f"{what} the live database failed: {exc}") from None
        if status == b"E":
            raise DatabaseUnavailable(
                f"{what} the live database failed in the server: {body[:1000].decode('utf-8', 'replace')}"
            )
        return body


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no complete reply before the deadline")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except TimeoutError:
            raise TimeoutError("no complete reply before the deadline") from None
        if not chunk:
            raise ConnectionError("the server closed its end")
        buf += chunk
    return bytes(buf)
