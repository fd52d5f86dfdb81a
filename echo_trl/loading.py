"""Load what commands take by name: tokenizers, and trajectories from a dataset or episode files."""

from __future__ import annotations

from pathlib import Path

import datasets

from .awm import is_episode_file
from .dataset import build_awm_dataset, load_echo_dataset
from .errors import EchoTrlError


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False):
    """``AutoTokenizer`` for a local path or Hub id, with an error a user can act on."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise EchoTrlError(f"cannot load tokenizer {name_or_path!r}: {exc}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise EchoTrlError(f"tokenizer {name_or_path!r} has no chat template; ECHO renders trajectories with it")
    return tokenizer


def is_episode_input(path: str | Path) -> bool:
    """Raw episode files (or a directory of them) rather than a saved dataset."""
    p = Path(path)
    if p.is_file():
        return is_episode_file(p)
    return p.is_dir() and not (p / "dataset_info.json").exists() and not (p / "dataset_dict.json").exists() \
        and any(is_episode_file(f) for f in p.rglob("*"))


def load_trajectories(name_or_path: str, split: str = "train") -> datasets.Dataset:
    """A trajectory dataset from a ``build-dataset`` directory, a Hub id, or raw episode files."""
    if is_episode_input(name_or_path):
        return build_awm_dataset([name_or_path])
    return load_echo_dataset(name_or_path, split=split)
