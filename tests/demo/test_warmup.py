"""The shared warm-up of the tiny demo model never shows it an environment output, and is cached."""

from __future__ import annotations

import json

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
