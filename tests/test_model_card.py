"""The model card: TRL's card plus ECHO settings, final world-model metrics and the ECHO / AWM citations."""

from __future__ import annotations

import pytest
from conftest import tiny_tokenizer
from test_trainer import dataset, tiny_model

from echo_trl.config import EchoGRPOConfig
from echo_trl.model_card import SECTION_MARKER, final_metrics
from echo_trl.trainer import EchoGRPOTrainer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def test_save_model_writes_card_with_echo_settings_metrics_and_citations(tmp_path):
    out = tmp_path / "my-echo-model"
    args = EchoGRPOConfig(output_dir=str(out), per_device_train_batch_size=2, num_generations=2, max_steps=2,
                          use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
                          max_completion_length=1024, gradient_checkpointing=False, disable_tqdm=True,
                          world_model_coeff=0.07, world_model_coeff_schedule="linear_decay", world_model_coeff_end=0.01,
                          world_loss_normalization="token", world_loss_target="observation",
                          eval_strategy="steps", eval_steps=2, per_device_eval_batch_size=2)
    trainer = EchoGRPOTrainer(tiny_model(), args=args, train_dataset=dataset(4), eval_dataset=dataset(2),
                              processing_class=tiny_tokenizer("qwen3"))
    trainer.train()
    trainer.save_model()
    card = (out / "README.md").read_text()
    # TRL's card: metadata, trainer name, framework versions, tags
    assert card.startswith("---") and "ECHO-GRPO" in card and "### Framework versions" in card
    assert "- echo" in card and "- grpo" in card and "- trl" in card
    # ECHO settings
    assert "| λ (`world_model_coeff`) | 0.07 |" in card
    assert "linear_decay to 0.01 over the whole run" in card
    assert "| target tokens (`world_loss_target`) | observation |" in card
    assert "| normalization (`world_loss_normalization`) | token |" in card
    # final world metrics, as logged
    final = final_metrics(trainer.state.log_history)
    assert {"world/ce_env", "eval_world/ce_env", "world/tokens_env"} <= set(final)
    for key in ("world/ce_env", "eval_world/ce_env"):
        step, value = final[key]
        assert f"| `{key}` | {value:.4g} | {step} |" in card
    # citations: ECHO (TRL's trainer citation and ours) and AWM
    assert "2605.24517" in card and "2602.10090" in card and "Agent World Model" in card
    assert card.index(SECTION_MARKER) < card.index("### Framework versions")
    # a later card replaces the ECHO section instead of adding a second one
    trainer.create_model_card(model_name="my-echo-model", dataset_name="me/awm-echo")
    card = (out / "README.md").read_text()
    assert card.count(SECTION_MARKER) == 1 and "me/awm-echo" in card


def test_save_model_elsewhere_writes_no_card(tmp_path):
    args = EchoGRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                          max_steps=1, use_cpu=True, bf16=False, report_to="none", save_strategy="no",
                          gradient_checkpointing=False, disable_tqdm=True)
    trainer = EchoGRPOTrainer(tiny_model(), args=args, train_dataset=dataset(2),
                              processing_class=tiny_tokenizer("qwen3"))
    trainer.save_model(str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "model.safetensors").exists() and not (tmp_path / "copy" / "README.md").exists()
