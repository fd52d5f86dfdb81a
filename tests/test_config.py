"""EchoGRPOConfig: fields, help metadata, validation, the lambda warning, TRL-style parsing."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from helpers.trainer import tiny_config

from echo_trl.config import EchoConfigError, EchoGRPOConfig

ECHO_FIELDS = [
    "world_model_coeff",
    "world_model_coeff_schedule",
    "world_model_coeff_end",
    "world_model_coeff_steps",
    "world_model_coeff_values",
    "world_loss_target",
    "world_loss_normalization",
    "world_loss_temperature",
    "use_policy_loss",
    "wm_filter_min_valid_tool_call_pct",
    "wm_filter_min_parse_clean_pct",
    "wm_filter_min_correct_pct",
    "max_world_model_tokens",
]


def cfg(tmp_path, **kw):
    return tiny_config(tmp_path, **kw)


def test_every_echo_field_has_help_and_the_documented_defaults(tmp_path):
    fields = {f.name: f for f in dataclasses.fields(EchoGRPOConfig)}
    for name in ECHO_FIELDS:
        assert len(fields[name].metadata.get("help", "")) > 20, name
    c = cfg(tmp_path)
    assert (c.world_model_coeff, c.world_model_coeff_schedule, c.world_loss_target) == (0.05, "constant", "env_only")
    assert c.world_loss_temperature == 1.0 and c.use_policy_loss is True
    assert c.world_loss_normalization == "sequence" and c.max_world_model_tokens is None
    assert c.temperature == 1.0  # TRL's default: the world term reuses GRPO's log-probs as they are


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"world_model_coeff": -0.1}, "world_model_coeff"),
        ({"world_model_coeff": float("nan")}, "world_model_coeff"),
        ({"world_model_coeff_schedule": "cosine"}, "world_model_coeff_schedule"),
        ({"world_model_coeff_schedule": "step_decay"}, "step_decay"),
        (
            {
                "world_model_coeff_schedule": "step_decay",
                "world_model_coeff_steps": [10, 5],
                "world_model_coeff_values": [0.02, 0.01],
            },
            "strictly increasing",
        ),
        (
            {
                "world_model_coeff_schedule": "step_decay",
                "world_model_coeff_steps": [10],
                "world_model_coeff_values": [0.02, 0.01],
            },
            "same",
        ),
        ({"world_model_coeff_schedule": "linear_decay", "world_model_coeff_steps": [0]}, "linear_decay"),
        ({"world_model_coeff_steps": [5]}, "linear_decay' or 'step_decay"),
        ({"world_loss_target": "everything"}, "world_loss_target"),
        ({"world_loss_normalization": "batch"}, "world_loss_normalization"),
        ({"world_loss_temperature": 0.0}, "world_loss_temperature"),
        ({"wm_filter_min_correct_pct": 120}, "percentage"),
        ({"max_world_model_tokens": 0}, "max_world_model_tokens"),
        ({"use_policy_loss": False, "world_model_coeff": 0.0}, "nothing to train"),
    ],
)
def test_impossible_settings_are_clear_errors(tmp_path, kw, match):
    with pytest.raises(EchoConfigError, match=match):
        cfg(tmp_path, **kw)


def test_warns_above_lambda_0_1_only(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        cfg(tmp_path, world_model_coeff=0.1)  # at the threshold: silent
    with pytest.warns(UserWarning, match="collapse"):
        cfg(tmp_path, world_model_coeff=0.2)
    with pytest.warns(UserWarning, match="collapse"):  # a schedule that climbs above it warns too
        cfg(
            tmp_path,
            world_model_coeff=0.05,
            world_model_coeff_schedule="step_decay",
            world_model_coeff_steps=[10],
            world_model_coeff_values=[0.3],
        )


def test_valid_schedules_are_accepted(tmp_path):
    c = cfg(
        tmp_path,
        world_model_coeff_schedule="step_decay",
        world_model_coeff_steps=[10, 20],
        world_model_coeff_values=[0.02, 0.01],
    )
    assert c.world_model_coeff_values == [0.02, 0.01]
    assert (
        cfg(tmp_path, world_model_coeff_schedule="linear_decay", world_model_coeff_end=0.01).world_model_coeff_end
        == 0.01
    )


def test_trl_parser_reads_echo_flags_and_yaml(tmp_path):
    from trl import ModelConfig, TrlParser

    yaml = tmp_path / "recipe.yaml"
    yaml.write_text("world_model_coeff: 0.03\nworld_loss_target: observation\nlearning_rate: 0.0002\n")
    parser = TrlParser((EchoGRPOConfig, ModelConfig))
    args, model = parser.parse_args_and_config(
        [
            "--config",
            str(yaml),
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "--report_to",
            "none",
            "--per_device_train_batch_size",
            "2",
            "--num_generations",
            "2",
            "--world_loss_normalization",
            "token",
            "--world_model_coeff_schedule",
            "step_decay",
            "--world_model_coeff_steps",
            "5",
            "9",
            "--world_model_coeff_values",
            "0.02",
            "0.01",
            "--use_peft",
            "--lora_r",
            "4",
        ]
    )
    assert (args.world_model_coeff, args.world_loss_target, args.learning_rate) == (0.03, "observation", 0.0002)
    assert args.world_loss_normalization == "token"
    assert args.world_model_coeff_steps == [5, 9] and args.world_model_coeff_values == [0.02, 0.01]
    assert model.use_peft and model.lora_r == 4
