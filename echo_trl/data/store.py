"""Saved trajectory datasets: recognise, load, validate, save (atomically, with the card) and push.

A saved dataset is a ``save_to_disk`` directory (:func:`saved_dataset_kind`), local data files
or a Hub id; :func:`validate_dataset` checks any of them against the ECHO row schema
(:mod:`echo_trl.data.schema`) and casts compatible ones to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Features

from ..errors import DatasetSchemaError, EchoTrlError
from ..io.outputs import atomic_output_dir
from .card import dataset_card
from .content import with_content_fingerprint
from .hub import hub_endpoint, hub_offline, hub_unreachable
from .readers.fields import BEHAVIOR_LOGPROB_FLOOR, BEHAVIOR_LOGPROB_RANGE, BEHAVIOR_LOGPROB_TOLERANCE, logprob_problem
from .readers.records import SkippedRecord
from .schema import FEATURES, REQUIRED_COLUMNS

__all__ = ["check_rows", "column_values", "load_echo_dataset", "save_dataset", "validate_dataset"]

#: A file every ``save_to_disk`` directory of one split has: what makes an existing ``--output`` replaceable.
DATASET_MARKER = "dataset_info.json"
#: The file ``save_to_disk`` writes for a ``DatasetDict`` (several splits).
DATASET_DICT_MARKER = "dataset_dict.json"


def column_values(ds: datasets.Dataset, name: str) -> list:
    """One column of ``ds`` as a list, under its row selection, read as Arrow: ``list(ds[name])`` formats every row
    as Python objects first (seconds per 10k rows of a dataset carrying token columns; minutes at 100k)."""
    return ds.with_format("arrow", columns=[name])[:][name].to_pylist()


def saved_dataset_kind(path: str | Path) -> str | None:
    """What ``save_to_disk`` left at ``path``: ``"dataset"`` (one split), ``"dataset_dict"`` (splits) or ``None``.

    ``None`` for anything else (episode files, a directory of them, data files, a Hub id).
    """
    path = Path(path)
    if not path.is_dir():
        return None
    if (path / DATASET_MARKER).exists():
        return "dataset"
    if (path / DATASET_DICT_MARKER).exists():
        return "dataset_dict"
    return None


def validate_dataset(ds: datasets.Dataset, name: str = "dataset") -> datasets.Dataset:
    """Check the columns ECHO needs; cast compatible schemas (e.g. parquet from the Hub) to ours."""
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        if "messages" in ds.column_names:  # TRL's conversational format: build-dataset reads it as conversation logs
            how = (
                "it looks like a TRL conversational dataset: write it as JSONL conversation logs, one "
                "{messages, reward} per line (`ds.to_json('conversations.jsonl')`, with a reward column), then "
                "`echo-trl build-dataset conversations.jsonl --output DIR`"
            )
        else:
            how = "build it from recorded episodes or conversation logs: `echo-trl build-dataset FILES --output DIR`"
        raise DatasetSchemaError(
            f"{name}: missing column(s) {', '.join(missing)}; expected the ECHO trajectory schema "
            f"({', '.join(REQUIRED_COLUMNS)}): {how}"
        )
    if "behavior_logprobs" not in ds.column_names:
        ds = ds.add_column("behavior_logprobs", [None] * len(ds), feature=FEATURES["behavior_logprobs"])
    if "format" not in ds.column_names:  # built before formats existed: chat-template
        ds = ds.add_column("format", ["chat-template"] * len(ds), feature=FEATURES["format"])
    extra = [c for c in ds.column_names if c not in FEATURES]
    if ds.features != FEATURES:
        wanted = Features({**{k: v for k, v in ds.features.items() if k in extra}, **FEATURES})
        try:
            ds = ds.cast(Features({c: wanted[c] for c in ds.column_names}))
        except (ValueError, TypeError) as exc:
            bad = [c for c in FEATURES if c in ds.features and ds.features[c] != FEATURES[c]]
            raise DatasetSchemaError(
                f"{name}: column(s) {', '.join(bad)} have the wrong feature type ({exc})"
            ) from None
    check_rows(ds, name)
    return ds


#: Rows per Arrow batch of :func:`check_rows` (bounded memory at any dataset size).
CHECK_BATCH_ROWS = 10_000


def check_rows(ds: datasets.Dataset, name: str = "dataset") -> None:
    """The row values the schema's types cannot express, read column-wise from Arrow (no row becomes a Python
    object; memory bounded by :data:`CHECK_BATCH_ROWS`): every ``behavior_logprobs`` value is a possible sampled
    token's log-prob (:func:`~echo_trl.data.readers.fields.logprob_problem`: finite, <= 0 up to a tolerance, above the
    floor), and ``warnings`` has one list per completion message (or none). The first bad value is a
    :class:`DatasetSchemaError` naming the dataset, row and field."""
    columns = [c for c in ("behavior_logprobs", "warnings", "completion") if c in ds.column_names]
    if not columns or not isinstance(ds, datasets.Dataset):
        return
    offset = 0
    for table in ds.select_columns(columns).with_format("arrow").iter(batch_size=CHECK_BATCH_ROWS):
        if "behavior_logprobs" in columns:
            _check_logprobs(table.column("behavior_logprobs").combine_chunks(), offset, name)
        if "warnings" in columns and "completion" in columns:
            _check_warning_lengths(table, offset, name)
        offset += table.num_rows


def _check_logprobs(column: pa.ListArray, offset: int, name: str) -> None:
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    bad = np.isnan(values) | (values < BEHAVIOR_LOGPROB_FLOOR) | (values > BEHAVIOR_LOGPROB_TOLERANCE)
    if not bad.any():
        return
    k = int(np.flatnonzero(bad)[0])
    parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    row = int(parents[k])
    j = k - int(lengths[:row].sum())
    raise DatasetSchemaError(
        f"{name}: row {offset + row}: behavior_logprobs[{j}]: {logprob_problem(float(values[k]))}; "
        f"{BEHAVIOR_LOGPROB_RANGE}"
    )


def _check_warning_lengths(table: pa.Table, offset: int, name: str) -> None:
    warnings = pc.fill_null(pc.list_value_length(table.column("warnings")), 0).to_numpy(zero_copy_only=False)
    messages = pc.fill_null(pc.list_value_length(table.column("completion")), 0).to_numpy(zero_copy_only=False)
    bad = (warnings != 0) & (warnings != messages)  # none at all: no warnings (row_to_trajectory fills them in)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DatasetSchemaError(
            f"{name}: row {offset + row}: warnings: {int(warnings[row])} entries for {int(messages[row])} "
            "completion messages (one list of warnings per completion message)"
        )


def damaged_dataset_message(what: str, name: str | Path, exc: BaseException) -> str:
    """One line for a local dataset that failed to load: the damaged file named when one is found.

    Checked only after a failure: every JSON file of the directory must parse and every Arrow file must read
    to its end (memory-mapped, so this costs no copy of the data).
    """
    path = Path(name)
    for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
        try:
            if file.suffix == ".json":
                json.loads(file.read_text(encoding="utf-8"))
            elif file.suffix == ".arrow":
                with pa.memory_map(str(file)) as source:
                    pa.ipc.open_stream(source).read_all()
        except (OSError, ValueError, pa.ArrowException) as bad:
            reason = " ".join(str(bad).split()) or type(bad).__name__
            return f"{what} {name}: {file.relative_to(path) if file != path else file} is damaged ({reason})"
    first = " ".join(str(exc).split()) or type(exc).__name__
    return f"cannot load {what} {name}: {type(exc).__name__}: {first}"


def load_echo_dataset(name_or_path: str | Path, split: str = "train", *, any_schema: bool = False) -> datasets.Dataset:
    """Load a trajectory dataset: a ``save_to_disk`` directory, local data files, or a Hub id. ``any_schema``: a
    dataset without the ECHO trajectory columns is returned as it is (``echo-trl sft`` takes any SFT dataset)."""
    if saved_dataset_kind(name_or_path):
        ds = datasets.load_from_disk(str(Path(name_or_path)))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
        ds = with_content_fingerprint(ds)  # derived caches (the cast below, tokens) keyed on the Arrow data
    else:
        ds = datasets.load_dataset(str(name_or_path), split=split)
    if any_schema and not set(REQUIRED_COLUMNS) <= set(ds.column_names):
        return ds
    return validate_dataset(ds, str(name_or_path))


def save_dataset(
    ds: datasets.Dataset,
    output_dir: str | Path,
    *,
    skipped: list[SkippedRecord] = (),
    push_to_hub: str | None = None,
    private: bool | None = None,
) -> Path:
    """``save_to_disk`` plus the dataset card and the skipped-records report; optionally push.

    Atomic: everything is written into a temporary sibling directory that then replaces
    ``output_dir`` in one rename, under a lock (:mod:`echo_trl.io.outputs`), so a killed or failed save
    leaves the previous dataset intact and a concurrent writer is refused. An existing
    ``output_dir`` must be empty or a previous dataset.
    """
    out = Path(output_dir)
    with atomic_output_dir(out, replace_if=DATASET_MARKER, needs=ds.data.nbytes) as tmp:
        ds.save_to_disk(str(tmp))
        card = dataset_card(ds, skipped=len(skipped))
        (tmp / "README.md").write_text(card, encoding="utf-8")
        if skipped:
            with (tmp / "skipped.jsonl").open("w", encoding="utf-8") as fh:
                for s in skipped:
                    fh.write(s.to_jsonl() + "\n")
    if push_to_hub:
        push_dataset(ds, card, push_to_hub, private=private, saved=out)
    return out


def push_dataset(ds: datasets.Dataset, card: str, repo: str, *, private: bool | None, saved: Path) -> None:
    """Push ``ds`` and its card to the Hub repo ``repo``; any failure is one line saying the local copy is kept.

    Everything here happens after the local save succeeded, over the network: whatever goes wrong (no network,
    ``HF_HUB_OFFLINE``, no token, a refused repo) leaves ``saved`` as it is, and the user can push it later.
    """
    kept = f"the dataset is saved in {saved} (kept)"
    if hub_offline():
        raise EchoTrlError(f"--push_to_hub {repo}: HF_HUB_OFFLINE is set, so nothing was pushed; {kept}")
    reason = hub_unreachable()
    if reason is not None:
        raise EchoTrlError(
            f"--push_to_hub {repo}: the Hugging Face Hub ({hub_endpoint()}) is unreachable ({reason}); {kept}"
        )
    from huggingface_hub import DatasetCard

    try:
        ds.push_to_hub(repo, private=private)
        DatasetCard(card).push_to_hub(repo, repo_type="dataset")
    except Exception as exc:  # noqa: BLE001 - network / Hub failures of every library layer, after the save
        first = " ".join(str(exc).split()) or type(exc).__name__
        raise EchoTrlError(f"--push_to_hub {repo}: push failed ({type(exc).__name__}: {first}); {kept}") from None
