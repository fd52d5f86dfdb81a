"""A name is a local path when it exists here and a Hub id otherwise: decide which, without surprises.

Local paths are never sent to the Hub: a missing one is an error at once, naming it. A Hub id is only tried
when the Hub answers a single short probe (or ``HF_HUB_OFFLINE`` is set, so the libraries read only their
cache); otherwise the error says so in one line instead of after ~30 s of library retries.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import EchoTrlError

#: Seconds the one Hub probe may take (DNS included) before the Hub counts as unreachable.
HUB_PROBE_TIMEOUT = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}
# owner/name or name: what the Hub accepts as a repo id (huggingface_hub's validate_repo_id, stricter on length)
_HUB_ID = re.compile(r"^(?!.*(--|\.\.))[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` is set: the Hub libraries look only in their local cache."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


@functools.cache
def _probe(endpoint: str, timeout: float) -> str | None:
    """Why ``endpoint`` cannot be reached (``None``: it answered). One request, no retries; run in a thread
    so a hanging DNS lookup (which socket timeouts do not cover) cannot hold the command."""
    result: list[str | None] = [f"no answer within {timeout:g}s"]

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            result[0] = None
        except urllib.error.HTTPError:  # the server answered (any status): it is reachable
            result[0] = None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            result[0] = str(reason) or type(reason).__name__

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0]


def hub_unreachable() -> str | None:
    """The reason the Hub cannot be reached right now, or ``None``."""
    return _probe(hub_endpoint(), HUB_PROBE_TIMEOUT)


def is_hub_id(name: str) -> bool:
    """Could ``name`` be a Hub repo id (``owner/name`` or ``name``)? Paths like ``./x``, ``/x``, ``a/b/c`` cannot."""
    return bool(_HUB_ID.match(name)) and not name.endswith((".json", ".jsonl", ".yaml", ".yml"))


def locate(name_or_path: str | os.PathLike, what: str) -> str:
    """``"local"`` when ``name_or_path`` exists here, ``"hub"`` when it is a Hub id worth trying.

    Raises :class:`EchoTrlError` (one line, naming it) for a missing local path, and for a Hub id
    while the Hub is unreachable (with the ``HF_HUB_OFFLINE`` hint), without any library retries.
    """
    name = os.fspath(name_or_path)
    if not name.strip():  # Path("") is the current directory: never what an empty flag value meant
        raise EchoTrlError(f"{what}: an empty name is neither a path nor a Hub id")
    if Path(name).expanduser().exists():
        return "local"
    if not is_hub_id(name):
        raise EchoTrlError(f"{what} {name}: no such file or directory")
    if hub_offline():
        return "hub"
    reason = hub_unreachable()
    if reason is not None:
        raise EchoTrlError(
            f"{what} {name}: no such file or directory, and the Hugging Face Hub ({hub_endpoint()}) is unreachable "
            f"({reason}); to use a copy in your Hub cache without network, set HF_HUB_OFFLINE=1"
        )
    return "hub"


def load_failure(what: str, name: str, exc: BaseException) -> EchoTrlError:
    """A library's failure to load ``name`` as one line: unreadable here, or not on the Hub (or its cache)."""
    first = " ".join(str(exc).split()) or type(exc).__name__
    if Path(name).expanduser().exists():
        return EchoTrlError(f"cannot load {what} {name}: {first}")
    if hub_offline():
        return EchoTrlError(
            f"{what} {name}: no such file or directory, and not in the local Hub cache "
            f"(HF_HUB_OFFLINE is set, so the Hub was not asked)"
        )
    return EchoTrlError(
        f"{what} {name}: no such file or directory, and the Hub has no such repository or cannot serve it ({first})"
    )
