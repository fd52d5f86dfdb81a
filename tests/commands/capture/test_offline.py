"""``capture --policy openai:URL --model NAME`` reads NAME's tokenizer from this machine only: a served model's
name is not a request to download it (offline, the Hub lookup cost ~45 s of retries before the first episode)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.docs import NetworkGuard
from helpers.tiny import tiny_tokenizer

from echo_trl.commands.capture.command import parse_args
from echo_trl.commands.capture.run import build_policy

LIBRARY = Path(__file__).resolve().parents[3] / "data" / "awm_scenarios"


def _argv(tmp_path, model: str, *extra: str) -> list[str]:
    return [
        *("--data", str(LIBRARY), "--scenario", "library_1", "--output", str(tmp_path / "out")),
        *("--policy", "openai:http://127.0.0.1:9/v1", "--model", model, *extra),
    ]


def test_a_model_name_not_on_this_machine_is_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    guard = NetworkGuard(monkeypatch)
    _, _, tokenizer = build_policy(parse_args(_argv(tmp_path, "someone/not-on-this-machine")))
    assert tokenizer is None and guard.count == 0, guard.attempts


def test_a_local_tokenizer_directory_is_still_used(tmp_path, monkeypatch):
    local = tmp_path / "tok"
    tiny_tokenizer("qwen3").save_pretrained(local)
    guard = NetworkGuard(monkeypatch)
    _, _, tokenizer = build_policy(parse_args(_argv(tmp_path, str(local))))
    assert tokenizer is not None and Path(tokenizer.name_or_path) == local and guard.count == 0


@pytest.mark.parametrize("flag", ["--tokenizer_from_hub", "--tokenizer-from-hub"])
def test_the_hub_is_asked_only_with_the_flag(tmp_path, monkeypatch, flag):
    assert parse_args(_argv(tmp_path, "someone/x", flag)).tokenizer_from_hub is True
    assert parse_args(_argv(tmp_path, "someone/x")).tokenizer_from_hub is False
