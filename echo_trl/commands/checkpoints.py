"""Which checkpoint ``--resume_from_checkpoint`` resumes from: the latest complete one, or the one named."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import EchoTrlError


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
