"""One redaction for every line the library prints or writes about a run: secrets never leave the process.

Why: an API key with a stray newline was printed whole in a header error, and a 401 body quoting the
``Authorization`` header was printed verbatim. Every error line (``echo-trl CMD: error: ...``), capture log
line, summary and episode note passes through :func:`redact`, which replaces each secret registered with
:func:`register_secret` (the API key, also as ``repr`` writes it) and the value of any ``Authorization`` /
``Bearer`` credential and the password of a URL (``https://user:PASSWORD@host``), whoever wrote it.
Imports nothing of echo_trl (any layer may use it).
"""

from __future__ import annotations

import re
import threading

__all__ = ["MASK", "redact", "register_secret"]

MASK = "[redacted]"
_lock = threading.Lock()
_secrets: set[str] = set()
# "Bearer X", "Basic X" and "Authorization: X" / "authorization": "X" / authorization=X whatever the scheme
_CREDENTIAL = re.compile(
    r"(?i)\b(bearer(?:\s+|%20))(?!\[redacted\])[^\s\"',;}\])]+|\b(basic(?:\s+|%20))[A-Za-z0-9+/]{8,}={0,2}"
)
_AUTHORIZATION = re.compile(
    r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(?!\[redacted\])(?!(?:bearer|basic)\b)([^\s\"',;}]+)"
)


# the password of a URL's user information (https://user:PASSWORD@host)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@")


def register_secret(value: str | None) -> None:
    """Redact ``value`` (and its ``repr`` spelling, its stripped form) from everything :func:`redact` sees."""
    if not value:
        return
    forms = {value, value.strip(), repr(value)[1:-1], ascii(value)[1:-1]}
    with _lock:
        _secrets.update(f for f in forms if len(f) >= 4)


def redact(text: str) -> str:
    """``text`` with every registered secret and every ``Authorization``/``Bearer`` value replaced by ``MASK``."""
    text = str(text)
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, MASK)
    text = _CREDENTIAL.sub(lambda m: f"{m[1] or m[2]}{MASK}", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m[1]}{MASK}@", text)
    return _AUTHORIZATION.sub(lambda m: f"{m[1]}{MASK}", text)
