"""The behaviour policy of recorded rows without ``behavior_logprobs``: the starting model, once per run.

GRPO's clipped objective bounds how far an update moves the policy from the one that sampled the
data, through the importance ratio ``pi(a) / pi_behaviour(a)``. Offline, a trajectory recorded
without log-probs has no known behaviour policy; taking the *current* policy at every update
(``behavior_policy="current"``) makes that ratio 1 at every step, so clipping never binds across
steps and a negative-advantage episode pushes its tokens down without limit. When the recordings
came from the model being trained (``echo-trl capture --policy model:``, or a team's own rollouts of
its starting checkpoint), the behaviour policy is known: the model at the start of training
(``behavior_policy="initial"``).

In code these are the *starting-model log-probs*, ``starting_logps`` throughout; on disk they keep the config's
word (the column :data:`~echo_trl.train.offline.collator.STARTING_LOGPS` is ``echo_initial_logprobs``, the
checkpoint file :data:`CHECKPOINT_FILE` is ``echo_initial_logprobs.pt``), so caches, saved datasets and
checkpoints written by earlier versions stay readable.

They are computed when training first uses a row (:class:`LazyStartingLogps`), not in a pass over the whole
dataset before step 1: the first step comes as fast at 100k rows as at 1k. Each batch's missing rows get one
no-gradient forward of the *starting* model (in eval mode, under the trainer's autocast, at TRL's ``temperature``,
with prefix sharing when it is on), at the action tokens the collator keeps; rows whose ``behavior_logprobs`` is
set keep those. The starting model, since the trainer's own has moved by then (:func:`starting_model`): under LoRA
with a fresh adapter the trainer's model with its adapters disabled (TRL's reference-model pattern), else TRL's
reference model when it holds the starting weights (``beta > 0``), else a frozen copy made at init (one more
model in memory; ``behavior_policy="current"`` needs none).

The values are appended, batch by batch, to a file under ``output_dir``
(:mod:`echo_trl.train.offline.starting_store`, in a directory named by the fingerprint of the tokenized dataset, the
starting model's weights and every setting that decides the numbers): a resumed run, or a later one with the same
fingerprint, reads them instead of forwarding again, and a run killed after an hour keeps what it computed. A resume
from a checkpoint of another directory also reads the store beside that checkpoint.

Under DeepSpeed ZeRO-3 and FSDP the weights are sharded (or not yet placed) at trainer init and the sharded forward
is collective, so no frozen copy can be made and processes could not forward different numbers of batches: there
the column is computed for the whole dataset inside the prepared model at the first training batch (before the
first optimizer step, so from the starting weights), :class:`StartingLogps`. Every process runs the same number of
forwards and lets the gathered weights go afterwards (:mod:`echo_trl.train.engines`); the fingerprint hashes every
process's shard. Checkpoints carry that column (:data:`CHECKPOINT_FILE`), and a resumed run takes it from there: it
is never recomputed from trained weights.

Rows reach the collator with a row number (:data:`TRAIN_INDEX`) the values are looked up by.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from accelerate.utils import gather_object
from datasets import Dataset, Features, List, Value

from ...data.content import dataset_content_key
from ...errors import EchoTrlError
from ...prefix.order import prefix_grouped_order
from ...progress import progress
from ...tokens.cache import cache_file_for, cache_root, map_progress, map_to_cache
from .. import trl_compat
from ..engines import local_shard, release_gathered
from ..model import causal_lm, weights_are_sharded
from .collator import STARTING_LOGPS, TRAIN_INDEX, CollatorSettings, collate_features, trajectory_features
from .recorded import is_trajectory_dataset, prefix_groups
from .starting_store import StartingStore

__all__ = [
    "CHECKPOINT_FILE",
    "STORE_DIR",
    "TRAIN_INDEX",
    "LazyStartingLogps",
    "StartingLogps",
    "with_starting_logps",
    "model_fingerprint",
]

logger = logging.getLogger(__name__)

#: Bumped whenever what the column holds changes, so stale caches are not reused.
VERSION = "1"
#: The starting-model column in a checkpoint (sharded runs: what a resumed run uses); the name of the first release.
CHECKPOINT_FILE = "echo_initial_logprobs.pt"
#: Under ``output_dir``: the lazily computed values, one directory per fingerprint (:mod:`.starting_store`).
STORE_DIR = "echo_starting_logps"


def unrecorded_rows(dataset) -> list[int]:
    """Indices of the rows whose ``behavior_logprobs`` is null (read as an Arrow null mask: no floats copied)."""
    if "behavior_logprobs" not in dataset.column_names:
        return list(range(len(dataset)))
    nulls = dataset.with_format("arrow")["behavior_logprobs"].is_null().to_numpy(zero_copy_only=False)
    return np.flatnonzero(nulls).tolist()


def model_fingerprint(model) -> str:
    """A hash of a model's weights (and config): two models with the same fingerprint compute the same log-probs.

    Per parameter tensor (adapters included): name, shape, dtype, its float64 sum and absolute sum, and
    4,096 evenly spaced values. Cheap on any device (no copy of the weights to the host; the float64 sums
    run over 16M-value slices, so no tensor is ever copied whole), and any training update changes it (an
    update moves every value of the tensors it touches).
    """
    model = causal_lm(model)
    h = hashlib.sha256(type(model).__name__.encode())
    h.update(model.config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = local_shard(p).detach().reshape(-1)  # sharded: this process's part (see sharded_fingerprint)
            sample = flat[:: max(1, flat.numel() // 4096)][:4096].float().cpu().numpy()
            sums = torch.zeros(2, dtype=torch.float64, device=flat.device)
            for part in flat.split(1 << 24):
                part = part.double()
                sums += torch.stack([part.sum(), part.abs().sum()])
            sums = sums.cpu().numpy()
            h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
            h.update(sample.tobytes())
            h.update(sums.tobytes())
    return h.hexdigest()[:16]


def sharded_fingerprint(trainer) -> str:
    """:func:`model_fingerprint` of every process's shard, in rank order (all processes must call it)."""
    parts = gather_object([model_fingerprint(trainer.model)])
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:16]


def _settings_fingerprint(trainer, settings: CollatorSettings, dataset, model_fp: str) -> str:
    a = trainer.args
    key = {
        # the Arrow data itself, not only its datasets fingerprint (the token cache: by its content-keyed path)
        "dataset": dataset_content_key(dataset, content_addressed=cache_root()),
        "model": model_fp,
        "temperature": trainer.temperature,
        "collation": [settings.max_completion_length, settings.max_length, settings.world_loss_target],
        "precision": [a.bf16, a.fp16],
        "sharing": [bool(a.prefix_sharing), a.prefix_sharing_min_tokens],
        "batch": [a.per_device_train_batch_size, trainer.accelerator.num_processes],
        "version": VERSION,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _micro_batches(dataset, todo: list[int], batch_size: int) -> list[list[int]]:
    """``todo`` in the grouped order (a group's rows, then a scenario's, side by side: prefix sharing) cut into
    micro-batches of ``batch_size``."""
    groups, scenarios = prefix_groups(dataset)
    wanted = set(todo)
    order = [i for i in prefix_grouped_order(groups, scenarios, seed=0, epoch=0, shuffle=False) if i in wanted]
    return [order[k : k + batch_size] for k in range(0, len(order), batch_size)]


def action_logps(
    trainer, rows: list[dict], settings: CollatorSettings, *, share: bool, source: StartingModel | None = None
) -> list[list[float]]:
    """One no-gradient forward of the collated ``rows`` (``source``'s model, else the trainer's): each row's
    log-probs at its kept action tokens, as float32 values."""
    tokenizer = trl_compat.tokenizer(trainer)
    features = [trajectory_features(tokenizer, row, settings) for row in rows]
    batch = collate_features(features, tokenizer.pad_token_id)
    model, adapters_off = (None, False) if source is None else source
    logps = trl_compat.no_grad_logps(trainer, batch, share=share, model=model, adapters_off=adapters_off)
    found = []
    for f, values in zip(features, logps.float().cpu(), strict=True):
        action = np.flatnonzero(np.asarray(f.action_mask, dtype=bool))
        found.append(values[torch.as_tensor(action, dtype=torch.long)].tolist())
    return found


def starting_logps(
    trainer, dataset, indices: list[int], settings: CollatorSettings, *, share: bool, sharded: bool = False
) -> dict[int, list[float]]:
    """The starting model's log-probs at the kept action tokens of rows ``indices`` of ``dataset``.

    Processes split the micro-batches round-robin and gather everyone's (all processes must call it).
    ``sharded``: the forward is collective, so a process with fewer micro-batches forwards its first one again
    (result dropped) until all have run as many, and the gathered weights are let go afterwards.
    """
    accelerator = trainer.accelerator
    batches = _micro_batches(dataset, indices, trainer.args.per_device_train_batch_size)
    mine = [(chunk, True) for chunk in batches[accelerator.process_index :: accelerator.num_processes]]
    if sharded and batches:
        rounds = -(-len(batches) // accelerator.num_processes)
        mine += [(mine[0][0] if mine else batches[0], False)] * (rounds - len(mine))
    model = trainer.model
    was_training = model.training
    model.eval()  # no dropout: the policy that sampled the recordings
    found: list[tuple[int, list[float]]] = []
    try:
        for chunk, kept in progress(mine, desc="starting-model log-probs (once per run)", unit="batch"):
            values = action_logps(trainer, [dataset[i] for i in chunk], settings, share=share)
            if kept:
                found.extend(zip(chunk, values, strict=True))
    finally:
        model.train(was_training)
        if sharded:
            release_gathered(trainer)
    if accelerator.num_processes > 1:
        found = gather_object(found)
    return dict(found)


class StartingModel(NamedTuple):
    """What forwards the starting policy during training: ``model`` (``None``: the trainer's own), with its
    adapters disabled when ``adapters_off``."""

    model: Any
    adapters_off: bool


def fresh_lora(model) -> bool:
    """A PEFT model whose adapters are all LoRA with every ``B`` matrix still 0 (PEFT's initialization): with them
    disabled it computes exactly what it computes with them on, so disabling them gives back the starting model."""
    configs = getattr(model, "peft_config", None)
    if not configs or any(str(getattr(c, "peft_type", "")) not in ("LORA", "PeftType.LORA") for c in configs.values()):
        return False
    with torch.no_grad():
        return all(not p.any() for n, p in model.named_parameters() if "lora_B" in n or "lora_embedding_B" in n)


def same_model(a, b) -> bool:
    """Same class, same config (but ``use_cache``, which TRL turns off on the policy: no effect on logits) and equal
    weights, value for value: ``a`` computes what ``b`` does."""
    a, b = causal_lm(a), causal_lm(b)
    config = lambda m: {k: v for k, v in m.config.to_dict().items() if k != "use_cache"}  # noqa: E731
    if type(a) is not type(b) or config(a) != config(b):
        return False
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return pa.keys() == pb.keys() and all(
        pa[n].dtype == pb[n].dtype and pa[n].shape == pb[n].shape and torch.equal(pa[n], pb[n].to(pa[n].device))
        for n in pa
    )


def starting_model(trainer) -> StartingModel:
    """The starting policy, kept for the whole run (at init, before any update): the trainer's model with adapters
    disabled (LoRA, fresh adapter), TRL's reference model when it holds the same weights, else a frozen copy."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if fresh_lora(model):
        return StartingModel(None, adapters_off=True)
    ref = getattr(trainer, "ref_model", None)
    if ref is not None and same_model(ref, model):
        return StartingModel(ref, adapters_off=False)
    frozen = copy.deepcopy(model).eval()
    frozen.requires_grad_(False)
    return StartingModel(frozen, adapters_off=False)


def with_starting_logps(
    trainer, dataset, settings: CollatorSettings, *, share: bool
) -> tuple[Dataset | Any, StartingLogps | LazyStartingLogps]:
    """At trainer init (on the token-cached train dataset, before any update): ``(dataset, source)``. When the run
    trains a policy with ``behavior_policy="initial"`` and some row recorded no log-probs, the dataset gets
    :data:`TRAIN_INDEX` and ``source.rows`` adds the starting model's log-probs to each batch's rows
    (:class:`LazyStartingLogps`; under ZeRO-3 / FSDP :class:`StartingLogps`); otherwise ``source`` does nothing.
    Nothing is forwarded here."""
    args = trainer.args
    if not is_trajectory_dataset(dataset):
        return dataset, StartingLogps()  # online: TRL's own old log-probs
    if STARTING_LOGPS in dataset.column_names:  # another run's (a saved trainer dataset): never trusted, recomputed
        dataset = dataset.remove_columns(STARTING_LOGPS)
    todo = unrecorded_rows(dataset) if args.use_policy_loss else []
    if not todo:
        return dataset, StartingLogps()
    if args.behavior_policy == "current":
        logger.warning(
            "offline ECHO: %d of %d trajectories carry no behavior_logprobs and behavior_policy='current': "
            "each update treats them as on-policy (importance ratio 1, as in GRPO without vLLM)",
            len(todo),
            len(dataset),
        )
        return dataset, StartingLogps()
    if TRAIN_INDEX in dataset.column_names:
        dataset = dataset.remove_columns(TRAIN_INDEX)
    dataset = dataset.add_column(TRAIN_INDEX, list(range(len(dataset))))
    if weights_are_sharded(trainer):  # no forward possible before the engine wraps the model: at the first batch
        return dataset, StartingLogps(dataset, todo=todo, settings=settings, share=share)
    fingerprint = _settings_fingerprint(trainer, settings, dataset, model_fingerprint(trainer.model))
    store = StartingStore(Path(args.output_dir) / STORE_DIR / fingerprint, rank=trainer.accelerator.process_index)
    return dataset, LazyStartingLogps(todo, settings, share, starting_model(trainer), store)


def _with_column(trainer, dataset: Dataset, fingerprint: str, compute) -> Dataset:
    """``dataset`` with :data:`STARTING_LOGPS` from ``compute()`` (row -> values), or from the ``datasets`` cache
    file of ``fingerprint`` when every process has it (``compute`` is collective)."""

    def column(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        values = compute()  # not called when the cache file exists: datasets loads it instead
        return {STARTING_LOGPS: [values.get(i) for i in indices]}

    cache_file = cache_file_for(dataset, "echo-initial-logps", fingerprint)
    features = Features({**dataset.features, STARTING_LOGPS: List(Value("float32"))})
    accelerator = trainer.accelerator
    if accelerator.num_processes > 1:  # the gather needs every process: compute unless all of them have the cache
        cached = torch.tensor([cache_file is not None and os.path.exists(cache_file)], device=accelerator.device)
        if not bool(accelerator.gather(cached).all()):
            compute()
    with accelerator.main_process_first(), map_progress(False):  # the forward has its own bar
        return map_to_cache(
            dataset,
            column,
            cache_file,
            fingerprint,
            batched=True,
            batch_size=1000,
            with_indices=True,
            features=features,
            desc="storing starting-model log-probs",
        )


class StartingLogps:
    """The starting model's column where it could not be computed at init (ZeRO-3, FSDP): computed inside the
    prepared model at the first training batch, added to each batch's rows by :data:`TRAIN_INDEX`, saved with
    every checkpoint and taken from it on resume. Without ``todo`` (the column is in the dataset, or not needed)
    every method is a no-op. ``dataset``: the train dataset the trainer iterates (with :data:`TRAIN_INDEX`)."""

    def __init__(
        self,
        dataset: Dataset | None = None,
        todo: list[int] | None = None,
        settings: CollatorSettings | None = None,
        share: bool = False,
    ):
        self.dataset, self.todo, self.settings, self.share = dataset, todo or [], settings, share
        self.values: dict[int, list[float]] | None = None

    def rows(self, trainer, rows: list[dict]) -> list[dict]:
        """``rows`` of a training batch with their :data:`STARTING_LOGPS` (computed at the first such batch: all
        processes reach it together)."""
        if not self.todo or not rows or TRAIN_INDEX not in rows[0]:
            return rows
        if self.values is None:
            if trainer.state.global_step > 0:
                raise EchoTrlError(
                    "behavior_policy='initial' under ZeRO-3/FSDP: the checkpoint this run resumed from holds no "
                    f"starting-model log-probs ({CHECKPOINT_FILE}) and they cannot be recomputed from trained "
                    "weights: resume from a checkpoint written with behavior_policy='initial' under this engine, "
                    "or set behavior_policy='current'"
                )
            self.values = self._compute(trainer)
        return [{**row, STARTING_LOGPS: self.values.get(row[TRAIN_INDEX])} for row in rows]

    def _compute(self, trainer) -> dict[int, list[float]]:
        dataset = self.dataset
        fingerprint = _settings_fingerprint(trainer, self.settings, dataset, sharded_fingerprint(trainer))
        compute = functools.cache(
            lambda: starting_logps(trainer, dataset, self.todo, self.settings, share=self.share, sharded=True)
        )
        column = _with_column(trainer, dataset, fingerprint, compute).select_columns(STARTING_LOGPS)[STARTING_LOGPS]
        return {i: column[i] for i in self.todo}

    def save(self, trainer, checkpoint: str) -> None:
        """Write the column into ``checkpoint`` (main process; called beside the RNG state of each checkpoint)."""
        if self.values is not None and trainer.accelerator.is_main_process:
            torch.save({"version": VERSION, "values": self.values}, os.path.join(checkpoint, CHECKPOINT_FILE))

    def load(self, checkpoint: str | None) -> None:
        """Take the column from the checkpoint a run resumes from (a file for other rows is ignored)."""
        path = None if checkpoint is None else os.path.join(checkpoint, CHECKPOINT_FILE)
        if self.todo and path is not None and os.path.isfile(path):
            saved = torch.load(path, weights_only=True)
            if saved.get("version") == VERSION and sorted(saved["values"]) == sorted(self.todo):  # same rows
                self.values = saved["values"]


class LazyStartingLogps:
    """The starting model's log-probs of each training batch's rows, computed when a row is first used and kept in
    ``store`` (see the module docstring): a row is forwarded once per fingerprint, across runs and resumes."""

    def __init__(
        self, todo: list[int], settings: CollatorSettings, share: bool, source: StartingModel, store: StartingStore
    ):
        self.todo, self.settings, self.share, self.source, self.store = set(todo), settings, share, source, store
        self.computed = 0  # rows forwarded by this process in this run (the rest came from the store)

    def rows(self, trainer, rows: list[dict]) -> list[dict]:
        """``rows`` of a training batch with their :data:`STARTING_LOGPS` (``None`` for rows with recorded ones)."""
        if not rows or TRAIN_INDEX not in rows[0]:
            return rows
        missing = {r[TRAIN_INDEX]: r for r in rows if r[TRAIN_INDEX] in self.todo and r[TRAIN_INDEX] not in self.store}
        if missing:
            self.store.append(self._forward(trainer, list(missing.values())))
            self.computed += len(missing)
        known = lambda i: self.store.get(i) if i in self.todo else None  # noqa: E731
        return [{**row, STARTING_LOGPS: known(row[TRAIN_INDEX])} for row in rows]

    def _forward(self, trainer, rows: list[dict]) -> dict[int, list[float]]:
        size = trainer.args.per_device_train_batch_size
        model = trainer.model
        was_training = model.training
        if self.source.adapters_off:
            model.eval()  # no dropout: the policy that sampled the recordings
        try:
            found = {}
            for k in range(0, len(rows), size):
                chunk = rows[k : k + size]
                values = action_logps(trainer, chunk, self.settings, share=self.share, source=self.source)
                found.update((row[TRAIN_INDEX], v) for row, v in zip(chunk, values, strict=True))
            return found
        finally:
            model.train(was_training)

    def save(self, trainer, checkpoint: str) -> None:
        """Nothing to write: every computed row is already in the store, beside the checkpoints."""

    def load(self, checkpoint: str | None) -> None:
        """Also read the store beside ``checkpoint`` (a resume from another run directory)."""
        if checkpoint is not None:
            other = Path(checkpoint).resolve().parent / STORE_DIR / self.store.directory.name
            if other.resolve() != self.store.directory.resolve() and other.is_dir():
                self.store.read(other)
