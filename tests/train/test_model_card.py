"""The model card: TRL's card plus the ECHO section (settings, final metrics, citations)."""

from __future__ import annotations

import math

import pytest
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import dataset, tiny_config

from echo_trl.data.citations import ECHO_CITATION
from echo_trl.train.model_card import SECTION_MARKER, echo_card_section, final_metrics
from echo_trl.trainer import EchoGRPOTrainer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def test_save_model_writes_card_with_echo_settings_metrics_and_citations(tmp_path):
    out = tmp_path / "my-echo-model"
    args = tiny_config(
        out,
        max_steps=2,
        world_model_coeff=0.07,
        world_model_coeff_schedule="linear_decay",
        world_model_coeff_end=0.01,
        world_loss_normalization="token",
        world_loss_target="observation",
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=2,
        behavior_policy="current",
    )
    trainer = EchoGRPOTrainer(
        tiny_model(),
        args=args,
        train_dataset=dataset(4),
        eval_dataset=dataset(2),
        processing_class=tiny_tokenizer("qwen3"),
    )
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
    assert "| behaviour policy of recordings without log-probs (`behavior_policy`) | current |" in card
    # final world metrics, as logged
    final = final_metrics(trainer.state.log_history)
    assert {"world/ce_env", "eval_world/ce_env", "world/tokens_env"} <= set(final)
    for key in ("world/ce_env", "eval_world/ce_env"):
        step, value = final[key]
        assert f"| `{key}` | {value:.4g} | {step} |" in card
    # citations: ECHO (once, as TRL's trainer citation), AWM and GRPO
    assert card.count("@article{echo2026") == 1 and ECHO_CITATION in card
    assert "2602.10090" in card and "Agent World Model" in card
    # an in-memory model has no name: no placeholder either
    assert "None" not in card and "huggingface.co/None" not in card
    assert f'model="{out}"' in card
    assert card.index(SECTION_MARKER) < card.index("### Framework versions")
    # a later card replaces the ECHO section instead of adding a second one
    trainer.create_model_card(model_name="my-echo-model", dataset_name="me/awm-echo")
    card = (out / "README.md").read_text()
    assert card.count(SECTION_MARKER) == 1 and "me/awm-echo" in card


def test_save_model_elsewhere_writes_no_card(tmp_path):
    args = tiny_config(tmp_path / "out")
    trainer = EchoGRPOTrainer(
        tiny_model(), args=args, train_dataset=dataset(2), processing_class=tiny_tokenizer("qwen3")
    )
    trainer.save_model(str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "model.safetensors").exists() and not (tmp_path / "copy" / "README.md").exists()


def _args(tmp_path, **kw):
    return tiny_config(tmp_path / "out", **kw)


def test_card_names_a_local_base_model_and_links_only_hub_names(tmp_path):
    base = tmp_path / "my-base"
    tiny_model().save_pretrained(base)
    tiny_tokenizer("qwen3").save_pretrained(base)
    trainer = EchoGRPOTrainer(str(base), args=_args(tmp_path), train_dataset=dataset(2))
    trainer.save_model()
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"fine-tuned version of `{base}`" in card  # TRL's template wrote [None](https://huggingface.co/None)
    assert "None" not in card and f'pipeline("text-generation", model="{tmp_path / "out"}"' in card
    # a Hub dataset keeps its link; a local dataset path is named without one
    trainer.create_model_card(dataset_name="me/awm-echo")
    assert "[me/awm-echo](https://huggingface.co/datasets/me/awm-echo)" in (tmp_path / "out" / "README.md").read_text()
    trainer.create_model_card(dataset_name=str(tmp_path))
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"`{tmp_path}`" in card and f"huggingface.co/datasets/{tmp_path}" not in card


def test_final_metrics_skip_missing_and_non_finite_values(tmp_path):
    # TRL logs reward None when every reward function returned None; a NaN can be logged too
    history = [
        {"step": 1, "reward": 0.5, "world/ce_env": 3.0},
        {"step": 2, "reward": None, "world/ce_env": math.nan},
        {"step": 3, "world/ce_env": float("inf"), "world/coeff": 0.05},
    ]
    assert final_metrics(history) == {"world/ce_env": (1, 3.0), "world/coeff": (3, 0.05), "reward": (1, 0.5)}
    section = echo_card_section(_args(tmp_path), history)
    assert "| `reward` | 0.5 | 1 |" in section and "nan" not in section.lower() and "inf |" not in section
