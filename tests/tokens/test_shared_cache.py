"""One token cache per (source content, tokenizer): token columns only, found again through any row selection or
column change, built in parallel with the same result, never half-written, shared by stats and training.

Expectations are independent: the tokenizer on each row (``tokenize_with_roles``), the token counts it gives
(for the size bound), and a build that must not happen (``tokenize_rows`` replaced by a failure).
"""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import numpy as np
import pytest
from helpers.shared_data import REPO
from helpers.tiny import tiny_tokenizer

from echo_trl.data.build import build_awm_dataset
from echo_trl.tokens import cache as token_cache
from echo_trl.tokens.cache import IDS, ROLES, TOKEN_COLUMNS, add_row_column, token_cache_dir, tokenize_dataset
from echo_trl.tokens.stats import token_stats
from echo_trl.tokens.tokenization import tokenize_with_roles
from echo_trl.train.offline.advantages import ADVANTAGE_COLUMN, with_advantages

EPISODES = REPO / "data" / "episodes"


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> datasets.Dataset:
    """The bundled episodes (60) saved and loaded back, as users train on."""
    path = tmp_path_factory.mktemp("ds") / "ds"
    build_awm_dataset([EPISODES]).save_to_disk(str(path))
    return datasets.load_from_disk(str(path))


def no_tokenizing(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(token_cache, "tokenize_rows", boom)


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_the_cache_holds_only_tokens_within_one_and_a_half_times_their_size(saved):
    tok = tiny_tokenizer("qwen3")
    ds = tokenize_dataset(saved, tok, num_proc=1)
    directory = token_cache_dir(saved, tok)
    token_bytes = 0  # int32 ids + int8 roles per token; prompt length, message ends (int32), 3 float64 per row
    for row in saved:
        fresh = tokenize_with_roles(tok, row)
        token_bytes += 5 * len(fresh) + 4 + 4 * len(fresh.message_token_spans) + 24
    assert directory.is_dir() and directory_bytes(directory) <= 1.5 * token_bytes
    assert set(datasets.Dataset.from_file(str(next(directory.glob("*.arrow")))).column_names) == set(TOKEN_COLUMNS)
    assert len(ds) == len(saved)


def test_selections_and_column_changes_find_the_same_cache(saved, monkeypatch):
    tok = tiny_tokenizer("qwen3")
    tokenize_dataset(saved, tok, num_proc=1)
    no_tokenizing(monkeypatch)
    picked = [37, 3, 12, 58, 0]
    views = {
        "shuffled, selected": saved.shuffle(seed=3).select(range(20)),
        "reward filter": saved.filter(lambda r: r["reward"] > 0.05),
        "picked rows": saved.select(picked),
        "advantages of picked rows": with_advantages(saved.select(picked), "group", "train_dataset"),
        "split": saved.train_test_split(test_size=0.25, seed=0)["test"],
        "column dropped": saved.remove_columns(["behavior_logprobs"]),
    }
    for name, view in views.items():
        assert token_cache_dir(view, tok) == token_cache_dir(saved, tok), name
        tokens = tokenize_dataset(view, tok)
        assert len(tokens) == len(view), name
        for i in (0, len(view) - 1):
            assert tokens[i][IDS] == tokenize_with_roles(tok, view[i]).input_ids, name
            assert tokens[i]["group_id"] == view[i]["group_id"], name
    adv = tokenize_dataset(views["advantages of picked rows"], tok)
    assert adv[ADVANTAGE_COLUMN] == views["advantages of picked rows"][ADVANTAGE_COLUMN]


def test_add_row_column_keeps_the_selection_and_the_values(saved):
    view = saved.select([5, 2, 9])
    added = add_row_column(view, "x", [0.5, -1.0, 2.0])
    assert added._indices is not None and added.data.num_rows == len(saved)  # no copy of the data
    assert added["x"] == [0.5, -1.0, 2.0] and added["group_id"] == view["group_id"]
    repeated = add_row_column(saved.select([1, 1]), "x", [1.0, 2.0])  # a repeated row: flattened, still right
    assert repeated["x"] == [1.0, 2.0]


def test_changed_content_gets_its_own_cache(saved, tmp_path):
    tok = tiny_tokenizer("qwen3")
    edited = saved.map(
        lambda r: {"completion": [{**m, "content": (m["content"] or "") + "!"} for m in r["completion"]]},
        cache_file_name=str(tmp_path / "edited.arrow"),
    )
    assert token_cache_dir(edited, tok) != token_cache_dir(saved, tok)
    in_memory = datasets.Dataset(saved.data.table)  # the same content in memory: keyed by its bytes
    again = datasets.Dataset(saved.data.table.slice(0))
    assert token_cache_dir(in_memory, tok) == token_cache_dir(again, tok)


def test_two_processes_build_the_same_cache(saved, monkeypatch, tmp_path):
    tok = tiny_tokenizer("qwen3")
    one = tokenize_dataset(saved, tok, num_proc=1)
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path / "other"))
    monkeypatch.setattr(token_cache, "BATCH_ROWS", 4)  # 60 rows: enough batches for two processes
    two = tokenize_dataset(saved, tok, num_proc=2)
    assert len(list(token_cache_dir(saved, tok).glob("*.arrow"))) == 2
    for column in TOKEN_COLUMNS:
        assert two[column] == one[column], column


def test_a_stopped_build_leaves_nothing(saved, monkeypatch):
    tok = tiny_tokenizer("qwen3")
    calls = []
    real = token_cache.tokenize_rows

    def stop_at_the_third_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(token_cache, "BATCH_ROWS", 8)
    monkeypatch.setattr(token_cache, "tokenize_rows", stop_at_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        tokenize_dataset(saved, tok, num_proc=1)
    assert os.listdir(token_cache.cache_root()) == []
    abandoned = token_cache.cache_root() / ".building-999999999-x"  # a killed build's (no such process)
    abandoned.mkdir()
    monkeypatch.setattr(token_cache, "tokenize_rows", real)
    tokenize_dataset(saved, tok, num_proc=1)
    assert not abandoned.exists() and os.listdir(token_cache.cache_root()) == [token_cache_dir(saved, tok).name]


def test_stats_builds_the_cache_training_reads(saved, monkeypatch):
    tok = tiny_tokenizer("qwen3")
    stats = token_stats(tok, saved, num_proc=1)
    rows = [tokenize_with_roles(tok, row) for row in saved]
    assert stats["tokens"]["env_output"] == sum(sum(t.env_output_mask) for t in rows)
    assert stats["total_tokens"] == sum(len(t) for t in rows)
    no_tokenizing(monkeypatch)
    tokens = tokenize_dataset(with_advantages(saved, "group", "train_dataset"), tok)  # what the trainer does
    assert np.array_equal(tokens[7][ROLES], rows[7].roles)


def test_build_false_reads_only(saved):
    tok = tiny_tokenizer("qwen3")
    assert tokenize_dataset(saved, tok, build=False) is None
    assert not token_cache_dir(saved, tok).exists()
