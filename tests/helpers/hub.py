"""A stand-in Hugging Face Hub endpoint that counts connections."""

from __future__ import annotations


class CountingEndpoint:
    """A stand-in Hub endpoint (HF_ENDPOINT) that counts connections and hangs up on each: a Hub that
    cannot be reached. The count shows whether a command asked it at all, and whether it retried."""

    def __init__(self):
        import socket
        import threading

        self.count = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()

    def env(self) -> dict[str, str]:
        import os

        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
        # TRL >= 1.16 pings its usage telemetry from every trainer's __init__ outside CI (a background thread that
        # honours HF_HUB_DISABLE_TELEMETRY): not a probe for a path, so it is switched off to count the probes alone
        return {**env, "HF_ENDPOINT": self.url, "ECHO_TRL_PROGRESS": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}

    def close(self):
        self.sock.close()
