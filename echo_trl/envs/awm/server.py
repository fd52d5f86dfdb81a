"""One scenario server: the generated FastAPI app + MCP, in a contained subprocess on a Unix socket.

A Unix socket needs no port (no races between parallel servers) and still works from inside a
network namespace with no interfaces, so the server can run with its network cut.

The socket path lives in ``server_dir``, which this class owns: whatever is already there (a
stale file, the dead socket of a SIGKILLed server, another process's listener) is unlinked
before the child starts, and readiness means the child itself bound the socket now at the path
(its ready marker names that inode), so a foreign listener never passes for a started server.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import time
from pathlib import Path

from . import sandbox
from .scenario import Scenario, ScenarioError

SERVE = str(Path(__file__).with_name("_serve.py"))
MAX_SOCKET_PATH = 107  # sun_path limit on Linux, minus the NUL


class ScenarioServer:
    """Start/stop the scenario's server over the database at ``db_path`` (inside ``server_dir``)."""

    def __init__(
        self,
        scenario: Scenario,
        server_dir: Path,
        db_path: Path,
        log_path: Path,
        *,
        containment: sandbox.Containment | None = None,
        start_timeout: float = 60.0,
    ):
        self.scenario, self.server_dir, self.db_path, self.log_path = scenario, server_dir, db_path, log_path
        self.socket_path = str(server_dir / "mcp.sock")
        self.ready_path = str(server_dir / "mcp.sock.ready")
        self.containment = containment
        self.start_timeout = start_timeout
        self.proc = None
        self.start_seconds: float | None = None

    def start(self) -> float:
        """Start the server and wait until its socket accepts connections; returns seconds taken."""
        code = self.scenario.require("env_code")
        if len(self.socket_path) > MAX_SOCKET_PATH:
            raise ScenarioError(
                f"socket path too long for a Unix socket ({len(self.socket_path)} chars): "
                f"{self.socket_path}; set TMPDIR to a shorter directory",
                scenario=self.scenario.name,
            )
        app = self.server_dir / "app.py"
        app.write_text(code, encoding="utf-8")
        self._clear_socket_path()
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = sandbox.spawn(
                [sys.executable, "-I", SERVE, str(app), str(self.db_path), self.socket_path, self.ready_path],
                cwd=str(self.server_dir),
                writable=[str(self.server_dir)],
                readonly=[SERVE],
                stdout=log,
                limits=sandbox.SERVER_LIMITS,
                containment=self.containment,
            )
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
            if self._ready():
                self.start_seconds = time.perf_counter() - t0
                return self.start_seconds
            time.sleep(0.02)
        self.stop()
        raise ScenarioError(
            f"the scenario server did not start within {self.start_timeout:g}s; server log:\n{self.log_tail()}",
            scenario=self.scenario.name,
            field="full_code",
        )

    def _clear_socket_path(self) -> None:
        """Unlink a stale or foreign socket (and an old ready marker): otherwise bind fails or we talk to it."""
        for path in (self.ready_path, self.socket_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise ScenarioError(
                    f"cannot take over the server socket path {path}: {exc}", scenario=self.scenario.name
                ) from None

    def _ready(self) -> bool:
        """Our child is alive and listening on the socket it bound (not on whatever else sits at the path)."""
        try:
            inode = int(Path(self.ready_path).read_text())
            st = os.lstat(self.socket_path)
        except (OSError, ValueError):
            return False
        return st.st_ino == inode and stat.S_ISSOCK(st.st_mode) and self._accepts() and self.alive()

    def _accepts(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            try:
                s.connect(self.socket_path)
                return True
            except OSError:
                return False

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
        try:
            data = self.log_path.read_bytes()[-limit:]
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace")

    def stop(self) -> None:
        sandbox.kill_tree(self.proc)
