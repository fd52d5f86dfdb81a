"""The shared warm-up of the tiny demo model never shows it an environment output, and is cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_trl.data.build import build_awm_dataset
from echo_trl.demo.tiny import ensure_tiny_model
from echo_trl.demo.warmup import WarmupSettings, warm_up_tiny_model, warmup_examples

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

SECRET = "zebraquokka"  # occurs only inside environment outputs


def _episode(i: int) -> dict:
    return {
        "scenario": "shop",
        "task": f"Find item {i} and add it to my cart.",
        "task_idx": i,
        "reward": 1.0,
        "tools": ["search", "verify"],
        "steps": [
            {
                "action": {"tool_name": "search", "arguments": {"query": f"item {i}"}},
                "observation": {
                    "tool_result": {"items": [{"id": i, "title": f"{SECRET} {SECRET}{i}"}]},
                    "reward_type": "tool_call_ok",
                    "done": False,
                },
            },
            {
                "action": {"tool_name": "verify", "arguments": {}},
                "observation": {
                    "verify_result": {"result": f"complete {SECRET}"},
                    "reward_type": "complete",
                    "done": True,
                },
            },
        ],
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("warmup")
    path = root / "eps.jsonl"
    path.write_text("".join(json.dumps(_episode(i)) + "\n" for i in range(4)))
    ds = build_awm_dataset([path])
    corpus = [SECRET, *(m["content"] or "" for row in ds for m in row["prompt"] + row["completion"])]
    model = ensure_tiny_model(root / "cache" / "tiny", family="qwen3", corpus=corpus, vocab_size=600, hidden_size=32)
    return ds, model


def test_env_outputs_are_never_inputs_nor_targets(setup, monkeypatch):
    """Independent of the role masks: spy on every forward of the warm-up and look for the env-only string."""
    from transformers import AutoTokenizer
    from transformers.models.qwen3 import modeling_qwen3

    ds, model = setup
    tokenizer = AutoTokenizer.from_pretrained(model)
    full = tokenizer.apply_chat_template(ds[0]["prompt"] + ds[0]["completion"], tokenize=False)
    assert SECRET in full  # the rendered trajectory does hold the env output ...
    seen = []
    forward = modeling_qwen3.Qwen3ForCausalLM.forward

    def spy(self, input_ids=None, **kw):
        seen.append(input_ids.clone())
        return forward(self, input_ids=input_ids, **kw)

    monkeypatch.setattr(modeling_qwen3.Qwen3ForCausalLM, "forward", spy)
    path, record = warm_up_tiny_model(model, ds, WarmupSettings(steps=3, batch_size=2, learning_rate=1e-3))
    assert len(seen) == 3 and not record["cached"]
    for batch in seen:
        for row in batch:
            text = tokenizer.decode(row, skip_special_tokens=False)
            assert SECRET not in text  # ... the warm-up never feeds it in
            assert "search" in text and "item" in text  # actions and context are there
    for ids, labels in warmup_examples(tokenizer, ds):
        targets = [t for t in labels if t != -100]
        assert targets and SECRET not in tokenizer.decode(targets)
        assert SECRET not in tokenizer.decode(ids)
        assert '"query"' in tokenizer.decode(targets)  # action tokens are targets


def test_cached_checkpoint_is_reused_and_keyed_by_settings(setup, monkeypatch):
    from echo_trl.demo import warmup

    ds, model = setup
    settings = WarmupSettings(steps=2, batch_size=2, learning_rate=1e-3, seed=1)
    first, rec = warm_up_tiny_model(model, ds, settings)
    assert not rec["cached"] and (first / "model.safetensors").exists() and first.parent == model.parent
    monkeypatch.setattr(warmup, "train_warmup", lambda *a, **k: pytest.fail("trained again instead of reusing"))
    again, rec = warm_up_tiny_model(model, ds, settings)
    assert again == first and rec["cached"]
    monkeypatch.undo()
    other, _ = warm_up_tiny_model(model, ds, WarmupSettings(steps=2, batch_size=2, learning_rate=1e-3, seed=2))
    assert other != first
    assert warm_up_tiny_model(model, ds, WarmupSettings(steps=0))[0] == model


def _copy_base(model, where):
    """A private copy of the tiny base model (each test's warm-up cache is then its own)."""
    import shutil

    where.mkdir(parents=True, exist_ok=True)
    shutil.copytree(model, where / "tiny")
    return where / "tiny"


def _loads(path, marker="echo_trl_warmup.json") -> bool:
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        json.loads((path / marker).read_text())
        AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError, SafetensorError):
        return False
    return True


@pytest.mark.parametrize("cache", ["warm-up", "tiny base model"])
def test_racing_writers_never_show_a_reader_a_half_written_cache(setup, cache, tmp_path, monkeypatch):
    """Writer A is held at the instant its model.safetensors is half-written, after writer B finished the same
    cache entry: a reader then must get B's whole model (or nothing), and A's finish must leave it whole."""
    import threading

    from transformers import PreTrainedModel

    ds, model = setup
    if cache == "warm-up":
        base = _copy_base(model, tmp_path)
        settings = WarmupSettings(steps=2, batch_size=2, learning_rate=1e-3, seed=3)
        marker = "echo_trl_warmup.json"

        def build():
            return warm_up_tiny_model(base, ds, settings)[0]

    else:
        marker = "echo_trl_tiny.json"

        def build():
            return ensure_tiny_model(tmp_path / "tiny-b", family="qwen3", vocab_size=300, hidden_size=16)

    at_save, b_done, mid_write, read_done = (threading.Event() for _ in range(4))
    real_save = PreTrainedModel.save_pretrained

    def save(self, directory, *args, **kwargs):
        if threading.current_thread().name != "writer-a":
            return real_save(self, directory, *args, **kwargs)
        at_save.set()
        assert b_done.wait(120)
        real_save(self, directory, *args, **kwargs)
        weights = Path(directory) / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])  # the file as it is half-way through its write
        mid_write.set()
        assert read_done.wait(120)
        weights.write_bytes(data)

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", save)
    results = {}
    a = threading.Thread(target=lambda: results.update(a=build()), name="writer-a")
    a.start()
    try:
        assert at_save.wait(120)
        results["b"] = build()  # writer B, start to finish
        b_done.set()
        assert mid_write.wait(120)
        path = build()  # the reader: finds the entry finished, or would build its own
        assert _loads(path, marker), "a reader was handed a half-written cache"
    finally:
        b_done.set()
        read_done.set()
        a.join(120)
    assert results["a"] == results["b"] == path and _loads(path, marker)
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no temporary left


def test_a_half_written_cache_from_before_is_replaced_not_trusted(setup, tmp_path):
    ds, model = setup
    base = _copy_base(model, tmp_path)
    settings = WarmupSettings(steps=2, batch_size=2, learning_rate=1e-3, seed=4)
    path, _ = warm_up_tiny_model(base, ds, settings)
    (path / "echo_trl_warmup.json").write_text('{"base": "cut')  # a marker cut mid-write
    again, record = warm_up_tiny_model(base, ds, settings)
    assert again == path and not record["cached"] and _loads(path)


def test_a_full_disk_during_the_warm_up_save_is_one_line_and_leaves_nothing(setup, tmp_path):
    from helpers.tmpfs import fill, small_tmpfs

    from echo_trl.errors import EchoTrlError

    ds, model = setup
    with small_tmpfs(tmp_path / "small", 4 << 20) as disk:
        base = _copy_base(model, disk)
        fill(disk, leave=16 << 10)
        with pytest.raises(EchoTrlError) as info:
            warm_up_tiny_model(base, ds, WarmupSettings(steps=2, batch_size=2, learning_rate=1e-3, seed=5))
        message = str(info.value)
        assert "\n" not in message and "-warm-" in message and "no space left on device (needs about" in message
        assert sorted(p.name for p in disk.iterdir()) == ["ballast", "tiny"]
