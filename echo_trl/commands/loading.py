"""Load what commands take by name (tokenizers, models, datasets, configs, checkpoints) without surprises.

A name is a local path when it exists here and a Hub id otherwise. Local paths are never sent
to the Hub: a missing one is an error at once, naming it. A Hub id is only tried when the Hub
answers a single short probe (or ``HF_HUB_OFFLINE`` is set, so the libraries read only their
cache); otherwise the error says so in one line instead of after ~30 s of library retries.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import datasets

from ..data.awm import is_episode_file
from ..data.dataset import build_awm_dataset, load_echo_dataset
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


def _load_failure(what: str, name: str, exc: BaseException) -> EchoTrlError:
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


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False):
    """``AutoTokenizer`` for a local path or Hub id, with an error a user can act on."""
    from transformers import AutoTokenizer

    locate(name_or_path, "tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise _load_failure("tokenizer", name_or_path, exc) from None
    if not getattr(tokenizer, "chat_template", None):
        raise EchoTrlError(f"tokenizer {name_or_path!r} has no chat template; ECHO renders trajectories with it")
    return tokenizer


def load_model(name_or_path: str, *, device: str | None = None, dtype: str = "auto", trust_remote_code: bool = False):
    """A causal LM, or base model + PEFT adapter when ``name_or_path`` holds an adapter.

    A local directory is an adapter exactly when it has ``adapter_config.json``: nothing is asked of the Hub.
    """
    import torch
    from transformers import AutoModelForCausalLM

    where = locate(name_or_path, "model")
    kwargs = {"dtype": dtype if dtype == "auto" else getattr(torch, dtype), "trust_remote_code": trust_remote_code}
    try:
        if where == "local":
            is_adapter = (Path(name_or_path) / "adapter_config.json").is_file()
        else:
            from huggingface_hub import file_exists

            is_adapter = file_exists(name_or_path, "adapter_config.json")
        if is_adapter:
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(name_or_path, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_failure("model", name_or_path, exc) from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device)


def load_dataset_named(name_or_path: str, split: str = "train", what: str = "dataset") -> datasets.Dataset:
    """:func:`~echo_trl.data.dataset.load_echo_dataset` after :func:`locate`, library errors as one line."""
    locate(name_or_path, what)
    try:
        return load_echo_dataset(name_or_path, split=split)
    except EchoTrlError:
        raise
    except (OSError, ConnectionError) as exc:  # FileNotFoundError, DatasetNotFoundError, offline cache misses
        raise _load_failure(what, name_or_path, exc) from None


def is_episode_input(path: str | Path) -> bool:
    """Raw episode files (or a directory of them) rather than a saved dataset."""
    p = Path(path)
    if p.is_file():
        return is_episode_file(p)
    return (
        p.is_dir()
        and not (p / "dataset_info.json").exists()
        and not (p / "dataset_dict.json").exists()
        and any(is_episode_file(f) for f in p.rglob("*"))
    )


def load_trajectories(name_or_path: str, split: str = "train") -> datasets.Dataset:
    """A trajectory dataset from a ``build-dataset`` directory, a Hub id, or raw episode files."""
    if is_episode_input(name_or_path):
        return build_awm_dataset([name_or_path])
    return load_dataset_named(name_or_path, split=split)


def check_config_file(argv: list[str]) -> None:
    """``--config PATH`` names a readable YAML mapping (TRL would raise a traceback)."""
    if "--config" not in argv:
        return
    i = argv.index("--config")
    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
        raise EchoTrlError("--config: expected a YAML file path after it")
    path = Path(argv[i + 1])
    if not path.is_file():
        raise EchoTrlError(f"--config {path}: no such file")
    import yaml

    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise EchoTrlError(f"--config {path}: not readable YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(config, dict):
        raise EchoTrlError(f"--config {path}: expected a mapping of flag names to values, got {type(config).__name__}")


def checkpoint_is_complete(path: Path) -> bool:
    """The Trainer writes ``trainer_state.json`` last: a checkpoint without a readable one was cut short
    (e.g. Ctrl-C during the save) and cannot be resumed from."""
    try:
        return "global_step" in json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def resolve_checkpoint(value: str | bool | None, output_dir: str) -> str | None:
    """``--resume_from_checkpoint``: ``true`` is the latest complete ``checkpoint-N`` in ``output_dir`` (as in
    transformers' ``train(resume_from_checkpoint=True)``, minus incomplete ones), a path must be complete."""
    if value is None or value is False or str(value).lower() in ("", "false", "no", "none"):
        return None
    if value is True or str(value).lower() in ("true", "yes", "latest"):
        out = Path(output_dir)
        steps = (
            sorted(
                (int(p.name.split("-")[1]), p)
                for p in out.glob("checkpoint-*")
                if p.is_dir() and p.name.split("-")[1].isdigit()
            )
            if out.is_dir()
            else []
        )
        complete = [p for _, p in steps if checkpoint_is_complete(p)]
        if not complete:
            found = f" ({len(steps)} incomplete: {', '.join(p.name for _, p in steps)})" if steps else ""
            raise EchoTrlError(f"--resume_from_checkpoint true: no complete checkpoint-N in {output_dir}{found}")
        return str(complete[-1])
    path = Path(value)
    if not path.is_dir():
        raise EchoTrlError(f"--resume_from_checkpoint {value}: no such checkpoint directory")
    if not checkpoint_is_complete(path):
        raise EchoTrlError(
            f"--resume_from_checkpoint {value}: incomplete checkpoint (no readable trainer_state.json; "
            "the save was interrupted): pick an earlier checkpoint, or pass true for the latest "
            "complete one"
        )
    return str(path)
