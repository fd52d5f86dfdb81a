"""LoRA end to end: `peft_config=LoraConfig(...)` (offline and online) and `echo-trl train --use_peft`.

Base weights stay as loaded, adapter weights move, the saved adapter reloads onto the base model with the
same logits, and ``merge_and_unload`` gives a plain model with the same logits too.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from datasets import Dataset
from helpers.tiny import tiny_tokenizer
from helpers.trainer import tiny_config
from transformers import AutoModelForCausalLM

from echo_trl.commands.cli import main as cli_main
from echo_trl.demo.tiny import build_tiny_model
from echo_trl.trainer import EchoGRPOTrainer

peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

TARGETS = ["q_proj", "v_proj"]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A tiny Qwen3-architecture model + tokenizer saved to disk (the LoRA base, loaded by path)."""
    path = tmp_path_factory.mktemp("lora") / "base"
    tok = tiny_tokenizer("qwen3")
    build_tiny_model(tok, "qwen3", hidden_size=32, num_layers=2, num_heads=4, seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _args(tmp_path, **kw):
    return tiny_config(
        tmp_path / "out", **{"per_device_train_batch_size": 4, "max_steps": 2, "learning_rate": 5e-2, **kw}
    )


def _base_name(peft_name: str) -> str:
    """PEFT parameter name -> the plain model's (drop the wrapper prefix and ``base_layer``)."""
    return peft_name.removeprefix("base_model.model.").replace(".base_layer", "")


def _probe_ids():
    tok = tiny_tokenizer("qwen3")
    return tok("<|im_start|>user\nBuy item 3.<|im_end|>\n<|im_start|>assistant\n", return_tensors="pt")["input_ids"]


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def _check_lora_training(model, base_dir):
    """Base weights as loaded from ``base_dir``; every LoRA B matrix (initialized to 0) has moved."""
    base = AutoModelForCausalLM.from_pretrained(base_dir).state_dict()
    lora_b, frozen = 0, 0
    for name, p in model.named_parameters():
        if "lora_" in name:
            if "lora_B" in name:
                assert p.abs().sum() > 0, f"{name} did not train"
                lora_b += 1
            continue
        assert not p.requires_grad, name
        torch.testing.assert_close(p.detach(), base[_base_name(name)], rtol=0, atol=0, msg=name)
        frozen += 1
    assert lora_b == 2 * len(TARGETS) and frozen > 0  # 2 layers x q_proj, v_proj


def _check_reload_and_merge(model, base_dir, adapter_dir):
    ids = _probe_ids()
    trained = _logits(model, ids)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    assert not torch.allclose(_logits(base, ids), trained)  # the adapter changes the output
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir)
    torch.testing.assert_close(_logits(reloaded, ids), trained, rtol=1e-5, atol=1e-5)
    merged = reloaded.merge_and_unload()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged, ids), trained, rtol=1e-4, atol=1e-4)


def test_offline_peft_config(tmp_path, base_dir):
    from helpers.trainer import dataset

    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM")
    trainer = EchoGRPOTrainer(
        str(base_dir),
        args=_args(tmp_path),
        train_dataset=dataset(4),
        processing_class=tiny_tokenizer("qwen3"),
        peft_config=config,
    )
    assert isinstance(trainer.model, PeftModel)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(h["world/tokens_env"] > 0 and h["world/loss_scaled"] > 0 for h in logs)
    _check_lora_training(trainer.model, base_dir)
    trainer.save_model()
    out = tmp_path / "out"
    assert (out / "adapter_model.safetensors").exists() and (out / "adapter_config.json").exists()
    assert not (out / "model.safetensors").exists()  # only the adapter is saved
    _check_reload_and_merge(trainer.model, base_dir, out)


def test_cli_use_peft(tmp_path, base_dir):
    from helpers.trainer import dataset

    dataset(4).save_to_disk(str(tmp_path / "data"))
    out = tmp_path / "cli"
    rc = cli_main(
        [
            "train",
            "--model_name_or_path",
            str(base_dir),
            "--dataset_name",
            str(tmp_path / "data"),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "4",
            "--num_generations",
            "2",
            "--use_cpu",
            "true",
            "--bf16",
            "false",
            "--report_to",
            "none",
            "--save_strategy",
            "no",
            "--logging_steps",
            "1",
            "--max_completion_length",
            "1024",
            "--gradient_checkpointing",
            "false",
            "--dtype",
            "float32",
            "--disable_tqdm",
            "true",
            "--learning_rate",
            "5e-2",
            "--use_peft",
            "--lora_r",
            "4",
            "--lora_alpha",
            "8",
            "--lora_dropout",
            "0",
            "--lora_target_modules",
            *TARGETS,
        ]
    )
    assert rc == 0
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == sorted(TARGETS)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), out)
    _check_lora_training(model, base_dir)
    _check_reload_and_merge(model, base_dir, out)


def test_online_tool_loop_with_peft_config(tmp_path, base_dir, monkeypatch):
    """Online (TRL's tool loop, scripted model turns to stay fast): one LoRA step trains the world term."""
    tok = tiny_tokenizer("qwen3")

    def lookup(city: str) -> str:
        """Weather of a city.

        Args:
            city: the city name.
        """
        return f"Sunny in {city}, 21 C"

    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM")
    rewards = itertools.cycle([1.0, 0.0])
    trainer = EchoGRPOTrainer(
        str(base_dir),
        reward_funcs=[lambda completions, **kw: [next(rewards) for _ in completions]],
        args=_args(tmp_path, per_device_train_batch_size=2, max_steps=1, max_completion_length=128),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "Weather in Paris?"}]] * 4}),
        processing_class=tok,
        tools=[lookup],
        peft_config=config,
    )
    call = '<tool_call>\n{"name": "lookup", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    turns = itertools.cycle([call, "It is sunny.<|im_end|>"])

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ids = tok(next(turns), add_special_tokens=False)["input_ids"]
        return [list(ids) for _ in prompt_ids], None

    monkeypatch.setattr(trainer, "_generate_single_turn", scripted)
    trainer.train()
    log = next(h for h in trainer.state.log_history if "world/tokens_env" in h)
    assert log["world/tokens_env"] > 0 and log["world/loss_scaled"] > 0
    _check_lora_training(trainer.model, base_dir)


def test_initial_behavior_logprobs_are_the_base_models_with_a_fresh_adapter(tmp_path, base_dir):
    """behavior_policy="initial" with LoRA: the starting policy is the base model (a fresh adapter's B is 0),
    so the stored log-probs equal the plain base model's, computed here without PEFT."""
    from helpers.trainer import batch, dataset, reference_logps

    from echo_trl.train.offline.starting_store import StartingStore

    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, task_type="CAUSAL_LM")
    trainer = EchoGRPOTrainer(
        str(base_dir),
        args=_args(tmp_path, behavior_policy="initial"),
        train_dataset=dataset(4),
        processing_class=tiny_tokenizer("qwen3"),
        peft_config=config,
    )
    source = trainer._echo_starting_logps.source
    assert source.model is None and source.adapters_off  # the trained model with its adapters off: no copy
    inputs = batch(trainer)
    action = inputs["tool_mask"].bool() & inputs["completion_mask"].bool()
    with torch.no_grad():
        expected = reference_logps(AutoModelForCausalLM.from_pretrained(base_dir), inputs)
    torch.testing.assert_close(inputs["old_per_token_logps"][action], expected[action], atol=1e-5, rtol=0)
    trainer.train()  # and training moves the adapter away from them: the ratio leaves 1, clipping can bind
    later = batch(trainer)
    with torch.no_grad():
        now = reference_logps(trainer.model, later)
    assert (now[action] - later["old_per_token_logps"][action]).abs().max() > 1e-3
    # rows first used after the updates: forwarded with the adapters off, still the base model's
    trainer._echo_starting_logps.store = StartingStore(tmp_path / "empty")
    fresh = batch(trainer)
    assert trainer.model.training  # the forward's eval mode did not stay
    torch.testing.assert_close(fresh["old_per_token_logps"][action], expected[action], atol=1e-5, rtol=0)
