"""A short, env-blind warm-up for the tiny random-init demo model.

A real user starts ECHO from a pretrained model, which already knows generic token statistics.
A random-init tiny model does not: any training on action tokens alone (plain GRPO, lambda = 0)
then also teaches it statistics shared with environment outputs and lowers held-out env CE for
reasons unrelated to world modelling. The warm-up stands in for pretraining: plain next-token
training on the *training* trajectories with every env-output (and harness-warning) token removed
from the sequence -- the model never sees an environment output, neither as input nor as target.
Targets are the context (system prompt, task, tools) and action (agent turns) tokens; the
template's tool-message wrappers stay as input only.

The warmed model is saved next to the base model, in a directory keyed by the base model, the
data and every warm-up setting, so reruns reuse it. Both arms of a comparison (ECHO and lambda = 0)
then start from this same checkpoint. The directory appears whole or not at all
(:func:`~echo_trl.demo.publish.publish_dir`): two demos warming up at once never let a reader see the
other's half-written weights.

torch, transformers and the tokenizer code load inside the functions that use them: the commands' warm-up
flags (:func:`add_warmup_arguments`, :func:`warmup_steps_help`) parse without them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..progress import progress
from ..roles import Role
from .publish import finished_record, publish_dir

#: Bumped whenever what the warm-up computes changes (invalidates cached checkpoints).
WARMUP_VERSION = 1
MARKER = "echo_trl_warmup.json"
IGNORE = -100


@dataclass(frozen=True)
class WarmupSettings:
    steps: int = 60
    learning_rate: float = 3e-3
    batch_size: int = 4
    max_completion_length: int | None = None  # completion tokens kept per trajectory (before env removal)
    seed: int = 0
    threads: int = 1  # torch CPU threads (:func:`torch_threads`): part of the cache key, the sums depend on it


#: torch CPU threads of the demo's warm-up and runs. The tiny model's ops are too small to gain from a second
#: thread: measured on 2 cores, one warm-up step took 1.65 CPU s with 1 thread and 3.8 with 2, and under load the
#: threads' waiting for each other made the run slower, not faster. A fixed count also keeps the numbers from
#: depending on the machine's core count (torch picks one thread per core, and a CPU kernel may split a sum by
#: thread).
DEMO_THREADS = 1


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op CPU threads set to ``n`` inside the block, put back after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


#: Defaults of the warm-up flags of the commands that warm the tiny model up (the demo, the curve script).
WARMUP_STEPS = 40
WARMUP_LEARNING_RATE = 3e-3


def warmup_steps_help(before: str) -> str:
    """The help of ``--warmup_steps`` of a command whose runs start ``before`` ("both runs")."""
    return (
        f"shared warm-up of the random-init tiny model before {before} (stands in for "
        "pretraining): next-token training on the train split's context + action tokens, env "
        "outputs removed (echo_trl.demo.warmup); cached next to the tiny model; 0 = start from "
        "random init"
    )


def add_warmup_arguments(parser, *, before: str = "every run") -> None:
    """``--warmup_steps`` / ``--warmup_learning_rate`` of an argparse command that warms the tiny model up (the
    two-stage comparison, the curve script), with :class:`WarmupSettings`' meaning."""
    parser.add_argument("--warmup_steps", type=int, default=WARMUP_STEPS, help=warmup_steps_help(before))
    parser.add_argument("--warmup_learning_rate", type=float, default=WARMUP_LEARNING_RATE)


def warmup_examples(tokenizer, rows, max_completion_length: int | None = None) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` per trajectory: env-output and warning tokens are dropped from the sequence;
    labels are the token ids at context and action positions, ``-100`` elsewhere (HF convention, unshifted)."""
    from ..tokens.tokenization import tokenize_batch

    examples = []
    for tok in tokenize_batch(tokenizer, list(rows)):
        ids, roles = np.asarray(tok.input_ids), np.asarray(tok.roles)
        if max_completion_length is not None:
            end = tok.prompt_length + max_completion_length
            ids, roles = ids[:end], roles[:end]
        keep = ~np.isin(roles, (Role.ENV_OUTPUT.code, Role.WARNING.code))
        ids, roles = ids[keep], roles[keep]
        labels = np.where(np.isin(roles, (Role.CONTEXT.code, Role.ACTION.code)), ids, IGNORE)
        examples.append((ids.tolist(), labels.tolist()))
    return examples


def _digest(base: Path, examples, settings: WarmupSettings) -> str:
    h = hashlib.sha256()
    base_marker = base / "echo_trl_tiny.json"
    h.update(base_marker.read_bytes() if base_marker.exists() else str(base.resolve()).encode())
    for name in ("model.safetensors", "tokenizer.json"):  # the base weights and tokenizer themselves
        h.update((base / name).read_bytes() if (base / name).exists() else b"")
    h.update(json.dumps({"v": WARMUP_VERSION, **asdict(settings)}, sort_keys=True).encode())
    for ids, labels in examples:
        h.update(np.asarray(ids, np.int64).tobytes())
        h.update(np.asarray(labels, np.int64).tobytes())
    return h.hexdigest()[:12]


def _batches(examples, batch_size: int, steps: int, seed: int, pad_id: int):
    import torch

    rng = np.random.default_rng(seed)
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += rng.permutation(len(examples)).tolist()
        picked, order = order[:batch_size], order[batch_size:]
        width = max(len(examples[i][0]) for i in picked)
        ids = torch.full((len(picked), width), pad_id, dtype=torch.long)
        labels = torch.full((len(picked), width), IGNORE, dtype=torch.long)
        attn = torch.zeros((len(picked), width), dtype=torch.long)
        for r, i in enumerate(picked):
            x, y = examples[i]
            ids[r, : len(x)] = torch.tensor(x)
            labels[r, : len(y)] = torch.tensor(y)
            attn[r, : len(x)] = 1
        yield ids, attn, labels


def train_warmup(model, examples, settings: WarmupSettings, pad_id: int) -> list[float]:
    """Next-token training of ``model`` on ``examples`` (see :func:`warmup_examples`); returns the losses."""
    import torch

    torch.manual_seed(settings.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    losses = []
    batches = _batches(examples, settings.batch_size, settings.steps, settings.seed, pad_id)
    for ids, attn, labels in progress(batches, desc="warm-up", unit="step", total=settings.steps):
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=IGNORE
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def warm_up_tiny_model(
    base: str | Path, rows, settings: WarmupSettings | None = None, *, log=None
) -> tuple[Path, dict[str, Any]]:
    """Warm up the tiny model at ``base`` on ``rows`` (training trajectories) without env outputs.

    Returns the warmed model's directory (``<base>-warm-<digest>``, reused when it exists) and its
    record (settings, token counts, losses). ``settings.steps == 0`` returns ``base`` unchanged.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = Path(base)
    settings = settings or WarmupSettings()
    if settings.steps <= 0:
        return base, {"steps": 0}
    tokenizer = AutoTokenizer.from_pretrained(base)
    examples = warmup_examples(tokenizer, rows, settings.max_completion_length)
    path = base.parent / f"{base.name}-warm-{_digest(base, examples, settings)}"
    cached = finished_record(path, MARKER)
    if cached is not None:
        return path, {**cached, "cached": True}
    model = AutoModelForCausalLM.from_pretrained(base)
    t0 = time.time()
    with torch_threads(settings.threads):
        losses = train_warmup(model, examples, settings, tokenizer.pad_token_id)
    record = {
        "base": str(base),
        "settings": asdict(settings),
        "examples": len(examples),
        "target_tokens": int(sum(sum(y != IGNORE for y in lab) for _, lab in examples)),
        "loss_first": losses[0],
        "loss_last": sum(losses[-5:]) / len(losses[-5:]),
        "seconds": round(time.time() - t0, 1),
        "version": WARMUP_VERSION,
    }
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    publish_dir(path, MARKER, lambda tmp: _save(tmp, tokenizer, model, record), needs=weights)
    if log:
        log(
            f"warm-up: {settings.steps} steps in {record['seconds']}s, loss {record['loss_first']:.3f} -> "
            f"{record['loss_last']:.3f} (context + action tokens; env outputs removed)"
        )
    return path, {**record, "cached": False}


def _save(directory: Path, tokenizer, model, record: dict[str, Any]) -> None:
    tokenizer.save_pretrained(directory)
    model.save_pretrained(directory)
    (directory / MARKER).write_text(json.dumps(record, indent=2), encoding="utf-8")  # last: marks it finished
