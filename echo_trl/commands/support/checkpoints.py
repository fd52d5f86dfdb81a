"""Which checkpoint ``--resume_from_checkpoint`` resumes from: the latest complete one, or the one named.

A checkpoint is complete when every file it holds loads, checked cheaply (no tensor is read):

* ``trainer_state.json`` (the Trainer writes it last) parses and has an integer ``global_step``;
* model weights are there (full model, shards, a PEFT adapter, or a DeepSpeed / FSDP state directory), and
  each ``*.safetensors`` file's header parses and its tensors end exactly at the end of the file;
* each ``torch.save`` file (``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``,
  ``echo_generation_buffer_*.pt``, ...) is a whole zip archive: its central directory (at the end of the
  file, so a truncated file has none) reads and every entry lies inside the file.

A save that ran out of space (:func:`checkpoint_saves`) is removed and named in one line.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import struct
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from ...errors import EchoTrlError
from ...io.outputs import disk_full_error, is_disk_full

__all__ = ["checkpoint_problem", "checkpoint_is_complete", "resolve_checkpoint", "checkpoint_saves"]

#: Files of a checkpoint that hold model weights (any one of them, or a directory in :data:`WEIGHT_DIRS`).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
#: Directories that hold the weights of DeepSpeed (``global_stepN``) and FSDP (``pytorch_model_fsdp_0``) saves.
WEIGHT_DIRS = ("global_step", "pytorch_model_fsdp")
#: Suffixes of ``torch.save`` files (zip archives since torch 1.6).
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a ``.safetensors`` file (``None``: header and length agree)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"truncated ({size} bytes, no header)"
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            return f"truncated (header of {length} bytes, file of {size})"
        try:
            header = json.loads(fh.read(length))
            ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "unreadable header (not a safetensors file, or damaged)"
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return f"{'truncated' if size < expected else 'too long'} (header says {expected} bytes, file has {size})"
    return None


def torch_file_problem(path: Path) -> str | None:
    """What is wrong with a ``torch.save`` zip archive (``None``: its directory reads and lies inside it)."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return f"truncated or damaged ({size} bytes; not a whole torch archive: {exc})"
    for e in entries:
        if e.header_offset + 30 + len(e.filename) + e.compress_size > size:
            return f"truncated ({size} bytes; entry {e.filename} runs past the end)"
    return None


def _weights_problem(path: Path) -> str | None:
    files = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    dirs = [d for d in path.iterdir() if d.is_dir() and d.name.startswith(WEIGHT_DIRS)]
    if not files and not dirs:
        return f"no model weights (none of {', '.join(WEIGHT_FILES)})"
    for index in (f for f in files if f.name.endswith(".index.json")):
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{index.name}: unreadable shard index"
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            return f"{index.name}: shard {missing[0]} is missing"
    if (path / "adapter_model.safetensors").is_file() or (path / "adapter_model.bin").is_file():
        try:
            json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "adapter_config.json: missing or unreadable (the adapter cannot load without it)"
    return None


def checkpoint_problem(path: str | Path) -> str | None:
    """``None`` when the checkpoint at ``path`` is complete, else what is wrong, starting with the file's name."""
    path = Path(path)
    state_file = path / "trainer_state.json"
    try:
        step = json.loads(state_file.read_text(encoding="utf-8")).get("global_step")
    except FileNotFoundError:
        return "trainer_state.json is missing (the save was interrupted)"
    except (OSError, ValueError, AttributeError):
        return "trainer_state.json is unreadable (the save was cut mid-write)"
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"trainer_state.json: global_step is {step!r}, not a step number"
    try:
        problem = _weights_problem(path)
        if problem:
            return problem
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            name = str(f.relative_to(path))
            if f.name.endswith(".safetensors"):
                problem = safetensors_problem(f)
            elif f.name.endswith(TORCH_SUFFIXES):
                problem = torch_file_problem(f)
            if problem:
                return f"{name} is {problem}"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return None


def checkpoint_is_complete(path: Path) -> bool:
    """Whether every file of the checkpoint loads (:func:`checkpoint_problem` finds nothing)."""
    return checkpoint_problem(path) is None


def _numbered_checkpoints(output_dir: str) -> list[Path]:
    out = Path(output_dir)
    if not out.is_dir():
        return []
    found = [(int(p.name.split("-")[1]), p) for p in out.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    return [p for _, p in sorted(found) if p.is_dir()]


def resolve_checkpoint(value: str | bool | None, output_dir: str) -> str | None:
    """``--resume_from_checkpoint``: ``true`` is the latest complete ``checkpoint-N`` in ``output_dir`` (as in
    transformers' ``train(resume_from_checkpoint=True)``, minus incomplete ones, which one line on stderr names),
    a path must be complete."""
    if value is None or value is False or str(value).lower() in ("", "false", "no", "none"):
        return None
    if value is True or str(value).lower() in ("true", "yes", "latest"):
        steps = _numbered_checkpoints(output_dir)
        skipped: list[str] = []
        for path in reversed(steps):
            problem = checkpoint_problem(path)
            if problem is None:
                if skipped:
                    print(f"resuming from {path}; skipped incomplete {'; '.join(skipped)}", file=sys.stderr)
                return str(path)
            skipped.append(f"{path.name} ({problem})")
        found = f" ({len(steps)} incomplete: {'; '.join(skipped)})" if steps else ""
        raise EchoTrlError(f"--resume_from_checkpoint true: no complete checkpoint-N in {output_dir}{found}")
    path = Path(value)
    if not path.is_dir():
        raise EchoTrlError(f"--resume_from_checkpoint {value}: no such checkpoint directory")
    problem = checkpoint_problem(path)
    if problem:
        raise EchoTrlError(
            f"--resume_from_checkpoint {value}: incomplete checkpoint: {problem}; pick an earlier checkpoint, "
            "or pass true for the latest complete one"
        )
    return str(path)


def checkpoint_save_size(model, output_dir: str) -> int:
    """About what one checkpoint of ``model`` takes: the size of the latest complete one in ``output_dir``, else
    the model's weights plus AdamW's two fp32 moments per trained value."""
    for path in reversed(_numbered_checkpoints(output_dir)):
        if checkpoint_problem(path) is None:
            return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    return weights + sum(8 * p.numel() for p in params if p.requires_grad)


@contextlib.contextmanager
def checkpoint_saves(output_dir: str, model) -> Iterator[None]:
    """Around ``trainer.train()`` and the final save: a save that runs out of space is one line naming what it
    was writing and the space a checkpoint needs; a checkpoint it cut short is removed.

    ``torch.save`` reports a full disk as a bare stream error, so a failure that left a new incomplete
    checkpoint on a filesystem with less free space than a checkpoint needs counts as one too.
    """
    before = set(_numbered_checkpoints(output_dir))
    try:
        yield
    except Exception as exc:
        cut = [p for p in _numbered_checkpoints(output_dir) if p not in before and checkpoint_problem(p)]
        needs = checkpoint_save_size(model, output_dir)
        if not cut:
            if is_disk_full(exc):  # the final save into output_dir
                after = "the final model there is incomplete, its checkpoints are whole"
                raise disk_full_error(output_dir, needs, after) from None
            raise
        try:
            short = shutil.disk_usage(cut[-1]).free < needs
        except OSError:
            short = False
        if not (is_disk_full(exc) or short):
            raise
        for path in cut:
            shutil.rmtree(path, ignore_errors=True)
        raise disk_full_error(cut[-1], needs) from None
