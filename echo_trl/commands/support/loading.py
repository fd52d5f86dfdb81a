"""Load what commands take by name (tokenizers, models, datasets) with errors a user can act on.

Where a name is looked for (here or on the Hub) is :func:`echo_trl.data.hub.locate`'s decision.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import pyarrow as pa
from datasets.exceptions import DatasetsError

from ...data.build import build_awm_dataset
from ...data.hub import load_failure, locate
from ...data.readers.episode_files import is_episode_file
from ...data.store import damaged_dataset_message, load_echo_dataset, saved_dataset_kind
from ...errors import EchoTrlError


def load_tokenizer(name_or_path: str, *, trust_remote_code: bool = False, chat_template_path: str | None = None):
    """``AutoTokenizer`` for a local path or Hub id, with an error a user can act on; rendering with the template
    of ``chat_template_path`` (TRL's convention: a ``.jinja`` file or a tokenizer) when given."""
    from transformers import AutoTokenizer

    from ...tokens.template.chat_template import apply_chat_template_path

    locate(name_or_path, "tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise load_failure("tokenizer", name_or_path, exc) from None
    apply_chat_template_path(tokenizer, chat_template_path, trust_remote_code=trust_remote_code)
    if not getattr(tokenizer, "chat_template", None):
        raise EchoTrlError(
            f"tokenizer {name_or_path!r} has no chat template; ECHO renders trajectories with it "
            "(pass one with --chat_template_path)"
        )
    return tokenizer


def load_model(name_or_path: str, *, device: str | None = None, dtype: str = "auto", trust_remote_code: bool = False):
    """A causal LM, or base model + PEFT adapter when ``name_or_path`` holds an adapter.

    A local directory is an adapter exactly when it has ``adapter_config.json``: nothing is asked of the Hub.
    """
    import torch
    from transformers import AutoModelForCausalLM

    where = locate(name_or_path, "model")
    if where == "local":
        check_model_dir(name_or_path, "model")
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
        raise load_failure("model", name_or_path, exc) from None
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device)


#: Files that make a local directory a model (or tokenizer, or adapter) rather than a dataset.
MODEL_FILES = ("config.json", "adapter_config.json", "tokenizer_config.json")


def check_not_model_dir(name_or_path: str, what: str) -> None:
    """A local directory that holds a model and no saved dataset is a mistake (the flags were swapped, say),
    not a folder of JSON data files for ``datasets`` to try to parse."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() and not saved_dataset_kind(path):
        found = [f for f in MODEL_FILES if (path / f).is_file()]
        if found:
            raise EchoTrlError(
                f"{what} {name_or_path}: is a model directory ({found[0]}), not a trajectory dataset "
                "(build one with `echo-trl build-dataset`)"
            )


def check_model_dir(name_or_path: str, what: str) -> None:
    """A local ``name_or_path`` must hold a model: ``config.json`` (or a PEFT ``adapter_config.json``)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() and not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
        kind = "a trajectory dataset" if saved_dataset_kind(path) else "a directory"
        raise EchoTrlError(f"cannot load {what} {name_or_path}: is {kind} without config.json, not a model directory")
    if path.is_file():
        raise EchoTrlError(f"{what} {name_or_path}: is a file, not a model directory or Hub id")


def load_dataset_named(
    name_or_path: str, split: str = "train", what: str = "dataset", *, any_schema: bool = False
) -> datasets.Dataset:
    """:func:`~echo_trl.data.store.load_echo_dataset` after :func:`locate`, library errors as one line.

    A local dataset that does not load (a truncated Arrow file, a damaged ``dataset_info.json``) is named with
    the file at fault where one can be found (:func:`~echo_trl.data.store.damaged_dataset_message`).
    """
    where = locate(name_or_path, what)
    if where == "local":
        check_not_model_dir(name_or_path, what)
    try:
        return load_echo_dataset(name_or_path, split=split, any_schema=any_schema)
    except EchoTrlError:
        raise
    except (OSError, ConnectionError) as exc:  # FileNotFoundError, DatasetNotFoundError, offline cache misses
        raise load_failure(what, name_or_path, exc) from None
    except (ValueError, TypeError, KeyError, pa.ArrowException, DatasetsError) as exc:
        if where != "local" or (isinstance(exc, (KeyError, ValueError)) and "split" in str(exc).lower()):
            raise  # a Hub library failure, or a missing split (the caller names it): not a damaged local file
        raise EchoTrlError(damaged_dataset_message(what, name_or_path, exc)) from None


def is_episode_input(path: str | Path) -> bool:
    """Raw episode files (or a directory of them) rather than a saved dataset."""
    p = Path(path)
    if p.is_file():
        return is_episode_file(p)
    return p.is_dir() and not saved_dataset_kind(p) and any(is_episode_file(f) for f in p.rglob("*"))


def load_trajectories(name_or_path: str, split: str = "train") -> datasets.Dataset:
    """A trajectory dataset from a ``build-dataset`` directory, a Hub id, or raw episode files."""
    if is_episode_input(name_or_path):
        return build_awm_dataset([name_or_path])
    return load_dataset_named(name_or_path, split=split)
