"""Tokenize once: cached token columns equal a fresh exact tokenization and are reused, never stale."""

from __future__ import annotations

import os

import datasets
import numpy as np
import pytest
from datasets import Value
from helpers.arrow_edit import redact_in_place
from helpers.shared_data import REPO
from helpers.tiny import tiny_tokenizer
from helpers.tmpfs import fill, small_tmpfs

from echo_trl.data.build import build_awm_dataset
from echo_trl.data.store import load_echo_dataset
from echo_trl.demo.tiny import build_tiny_tokenizer
from echo_trl.errors import EchoTrlError
from echo_trl.tokens import cache as token_cache
from echo_trl.tokens.cache import TOKEN_COLUMNS, has_tokens, row_tokens, tokenize_dataset
from echo_trl.tokens.tokenization import tokenize_with_roles

EPISODES = REPO / "data" / "episodes"
IDS_COLUMN = TOKEN_COLUMNS[0]


@pytest.fixture(scope="module")
def bundled() -> datasets.Dataset:
    return build_awm_dataset([EPISODES / "library_1_task0.jsonl", EPISODES / "library_1_task1.jsonl"])


@pytest.fixture
def saved(bundled, tmp_path) -> datasets.Dataset:
    """The bundled episodes saved and loaded back: a disk-backed dataset, as users train on."""
    bundled.save_to_disk(str(tmp_path / "ds"))
    return datasets.load_from_disk(str(tmp_path / "ds"))


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3", "llama3_1"])
def test_cached_columns_equal_a_fresh_exact_tokenization(bundled, family, monkeypatch, tmp_path):
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path))
    tok = tiny_tokenizer(family)
    ds = tokenize_dataset(bundled, tok)
    assert set(TOKEN_COLUMNS) <= set(ds.column_names) and len(ds) == len(bundled)
    for i, row in enumerate(ds):
        assert has_tokens(row)
        fresh = tokenize_with_roles(tok, bundled[i])
        cached = row_tokens(row)
        assert cached.input_ids == fresh.input_ids
        assert np.array_equal(cached.roles, fresh.roles)
        assert cached.prompt_length == fresh.prompt_length
        assert cached.message_token_spans == fresh.message_token_spans
        # A cut of the cached tokens is the cut of the fresh ones (the trainer's max_completion_length).
        limit = fresh.prompt_length + max(1, (len(fresh) - fresh.prompt_length) // 2)
        a, b = cached.truncate(limit), fresh.truncate(limit)
        assert a.input_ids == b.input_ids and np.array_equal(a.roles, b.roles)
        assert a.truncated_tokens == b.truncated_tokens


def test_second_call_reuses_the_cache_without_tokenizing(saved, monkeypatch):
    tok = tiny_tokenizer("qwen3")
    first = tokenize_dataset(saved, tok)
    cache = [f["filename"] for f in first.cache_files if f["filename"].startswith(str(token_cache.cache_root()))]
    assert cache and os.path.exists(cache[0])

    def boom(*args, **kwargs):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(token_cache, "tokenize_rows", boom)
    again = tokenize_dataset(saved, tok)  # a new run: same dataset, same tokenizer
    assert again[TOKEN_COLUMNS[0]] == first[TOKEN_COLUMNS[0]]


def test_another_chat_template_never_reuses_the_cache(saved):
    a, b = tiny_tokenizer("qwen3"), build_tiny_tokenizer("qwen3")
    b.chat_template = b.chat_template.replace("<tool_response>", "<tool_response>\n")
    assert token_cache.tokenizer_fingerprint(a) != token_cache.tokenizer_fingerprint(b)
    ta, tb = tokenize_dataset(saved, a), tokenize_dataset(saved, b)
    assert ta[0][TOKEN_COLUMNS[0]] != tb[0][TOKEN_COLUMNS[0]]
    assert tb[0][TOKEN_COLUMNS[0]] == tokenize_with_roles(b, saved[0]).input_ids


def test_equal_tokenizers_share_a_fingerprint():
    assert token_cache.tokenizer_fingerprint(build_tiny_tokenizer("qwen3")) == token_cache.tokenizer_fingerprint(
        tiny_tokenizer("qwen3")
    )


def test_stale_token_columns_are_recomputed(bundled, monkeypatch, tmp_path):
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path))
    tok = tiny_tokenizer("qwen3")
    other = build_tiny_tokenizer("llama3_1")
    stale = tokenize_dataset(bundled, other)  # tokens of another tokenizer travel with the rows
    fresh = tokenize_dataset(stale, tok)
    assert fresh[0][TOKEN_COLUMNS[0]] == tokenize_with_roles(tok, bundled[0]).input_ids


def test_nothing_is_written_in_the_dataset_directory(saved, monkeypatch, tmp_path):
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path / "cache"))
    directory = os.path.dirname(saved.cache_files[0]["filename"])
    before = sorted(os.listdir(directory))
    ds = tokenize_dataset(saved, tiny_tokenizer("qwen3"))
    assert sorted(os.listdir(directory)) == before
    assert any(f["filename"].startswith(str(tmp_path / "cache" / "tokens")) for f in ds.cache_files)


def test_a_row_that_cannot_render_is_named(bundled, monkeypatch, tmp_path):
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path))
    tok = build_tiny_tokenizer("qwen3")
    tok.chat_template = "{{ raise_exception('no') if messages|length > 7 else 'x' }}"
    with pytest.raises(EchoTrlError, match=r"row \d+ \(group_id 'library_1/\d'\)"):
        tokenize_dataset(bundled, tok)


EMAIL = "priya.raman@example.net"  # in a tool output of the bundled episodes


def _tool_outputs(row) -> str:
    return "".join(m["content"] or "" for m in row["completion"] if m["role"] == "tool")


@pytest.mark.parametrize("redaction", ["xxxxx.xxxxx@xxxxxxx.xxx", "[REDACTED]"], ids=["same-length", "shorter"])
def test_an_arrow_file_edited_in_place_is_tokenized_again(bundled, redaction, tmp_path, monkeypatch):
    """state.json (the datasets fingerprint) is untouched by the edit; the tokens must follow the new text."""
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path / "cache"))
    bundled.save_to_disk(str(tmp_path / "ds"))
    tok = tiny_tokenizer("qwen3")
    before = datasets.load_from_disk(str(tmp_path / "ds"))
    rows = [i for i in range(len(before)) if EMAIL in _tool_outputs(before[i])]
    assert rows, "the bundled episodes changed: pick another tool-output string"
    old_tokens = tokenize_dataset(before, tok)[IDS_COLUMN]

    assert redact_in_place(tmp_path / "ds", EMAIL, redaction) == 1
    after = datasets.load_from_disk(str(tmp_path / "ds"))
    assert after._fingerprint == before._fingerprint  # what the cache was keyed on alone
    assert EMAIL not in _tool_outputs(after[rows[0]]) and redaction in _tool_outputs(after[rows[0]])
    tokens = tokenize_dataset(after, tok)[IDS_COLUMN]
    for i in range(len(after)):
        assert tokens[i] == tokenize_with_roles(tok, after[i]).input_ids
    assert all(tokens[i] != old_tokens[i] for i in rows)


def test_an_edit_reaches_datasets_own_caches_through_the_loader(bundled, tmp_path, monkeypatch):
    """A saved dataset whose schema is cast on load (``float32`` reward): the cast's own cache file, keyed by
    ``datasets`` on the fingerprint, must not serve the old rows either."""
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path / "cache"))
    bundled.cast_column("reward", Value("float32")).save_to_disk(str(tmp_path / "ds"))
    tok = tiny_tokenizer("qwen3")
    first = load_echo_dataset(tmp_path / "ds")
    tokenize_dataset(first, tok)
    redact_in_place(tmp_path / "ds", EMAIL, "[REDACTED]")
    again = load_echo_dataset(tmp_path / "ds")
    assert not any(EMAIL in _tool_outputs(r) for r in again)
    tokens = tokenize_dataset(again, tok)
    assert all(tokens[i][IDS_COLUMN] == tokenize_with_roles(tok, again[i]).input_ids for i in range(len(again)))


def test_a_full_disk_while_caching_tokens_is_one_line_and_leaves_nothing(bundled, tmp_path, monkeypatch):
    with small_tmpfs(tmp_path / "small", 4 << 20) as disk:
        monkeypatch.setenv("ECHO_TRL_CACHE", str(disk / "cache"))
        bundled.save_to_disk(str(disk / "ds"))
        before = sorted(os.listdir(disk / "ds"))
        fill(disk, leave=64 << 10)  # the dataset fits, its token cache does not
        with pytest.raises(EchoTrlError) as info:
            tokenize_dataset(datasets.load_from_disk(str(disk / "ds")), tiny_tokenizer("qwen3"))
        message = str(info.value)
        assert "\n" not in message and message.startswith(str(disk / "cache" / "tokens")), message
        assert "no space left on device (needs about" in message
        assert sorted(os.listdir(disk / "ds")) == before
        assert os.listdir(disk / "cache" / "tokens") == []  # no staging directory, no partial cache
        (disk / "ballast").unlink()  # space again: the same call now caches the tokens
        tokens = tokenize_dataset(datasets.load_from_disk(str(disk / "ds")), tiny_tokenizer("qwen3"))
        assert tokens[0][IDS_COLUMN] == tokenize_with_roles(tiny_tokenizer("qwen3"), bundled[0]).input_ids
