"""Recipes in examples/configs/ parse with the parser their command uses and build the trainer config
(nothing runs); the accelerate configs in examples/accelerate_configs/ have the fields their names promise."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from echo_trl.commands.train import EchoScriptArguments, make_parser
from echo_trl.config import EchoGRPOConfig

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"
ACCELERATE = REPO / "examples" / "accelerate_configs"


def _online_module():
    spec = importlib.util.spec_from_file_location("train_online_awm", REPO / "examples" / "train_online_awm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _parse(parser, recipe: Path):
    return parser.parse_args_and_config(["--config", str(recipe)])


@pytest.fixture
def bf16_gpu(monkeypatch):
    """The GPU recipes set bf16: pretend a bf16 GPU exists (TrainingArguments refuses bf16 on a CPU box)."""
    import transformers.training_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)


def test_every_recipe_is_covered():
    assert {p.name for p in CONFIGS.glob("*.yaml")} == {
        "cpu_demo.yaml",
        "qwen3_0.6b_lora_1gpu.yaml",
        "qwen3_8b_zero3_vllm_online.yaml",
    }


def test_cpu_demo_recipe():
    script, args, model = _parse(make_parser(), CONFIGS / "cpu_demo.yaml")
    assert isinstance(script, EchoScriptArguments) and isinstance(args, EchoGRPOConfig)
    assert script.dataset_name == "outputs/awm_ds" and model.model_name_or_path == "outputs/tiny-qwen3"
    assert args.use_cpu and not args.bf16 and not model.use_peft
    assert args.world_model_coeff == 0.05 and args.world_loss_normalization == "sequence"
    assert args.generation_batch_size % args.num_generations == 0


def test_cpu_demo_recipe_command_line_overrides_yaml():
    _, args, _ = make_parser().parse_args_and_config(
        ["--config", str(CONFIGS / "cpu_demo.yaml"), "--max_steps", "2", "--world_model_coeff", "0"]
    )
    assert args.max_steps == 2 and args.world_model_coeff == 0.0


def test_qwen3_lora_recipe_offline_from_the_hub(bf16_gpu):
    from trl import get_peft_config

    script, args, model = _parse(make_parser(), CONFIGS / "qwen3_0.6b_lora_1gpu.yaml")
    assert model.model_name_or_path == "Qwen/Qwen3-0.6B" and not Path(script.dataset_name).exists()
    assert "/" in script.dataset_name  # a Hub dataset id
    assert model.use_peft and model.lora_r == 16
    peft = get_peft_config(model)
    assert peft is not None and set(peft.target_modules) >= {"q_proj", "v_proj"}
    assert not args.use_vllm and args.world_model_coeff == 0.05
    assert args.generation_batch_size % args.num_generations == 0


def test_qwen3_8b_online_recipe_zero3_vllm_server(bf16_gpu):
    online = _online_module()
    awm, args, model = _parse(online.make_parser(), CONFIGS / "qwen3_8b_zero3_vllm_online.yaml")
    assert isinstance(awm, online.AWMOnlineArguments) and isinstance(args, EchoGRPOConfig)
    assert model.model_name_or_path == "Qwen/Qwen3-8B"
    assert awm.awm_hub_repo and awm.awm_scenario
    assert args.use_vllm and args.vllm_mode == "server"
    assert args.world_model_coeff_schedule == "linear_decay" and args.world_model_coeff_end < args.world_model_coeff
    # the launch line in the recipe's header names the ZeRO-3 accelerate config, which exists
    header = (CONFIGS / "qwen3_8b_zero3_vllm_online.yaml").read_text()
    assert "examples/accelerate_configs/deepspeed_zero3.yaml" in header
    # local scenario data takes precedence over the recipe's Hub repo; splits.json picks the train tasks
    awm, _, _ = online.make_parser().parse_args_and_config(
        [
            "--config",
            str(CONFIGS / "qwen3_8b_zero3_vllm_online.yaml"),
            "--awm_data",
            str(REPO / "data" / "awm_scenarios"),
            "--awm_scenario",
            "library_1",
        ]
    )
    assert awm.awm_data and online.train_tasks(awm) == list(range(8))


@pytest.mark.parametrize(
    "name, kind, checks",
    [
        ("ddp.yaml", "MULTI_GPU", {}),
        ("deepspeed_zero2.yaml", "DEEPSPEED", {("deepspeed_config", "zero_stage"): 2}),
        (
            "deepspeed_zero3.yaml",
            "DEEPSPEED",
            {("deepspeed_config", "zero_stage"): 3, ("deepspeed_config", "zero3_init_flag"): True},
        ),
        (
            "fsdp2.yaml",
            "FSDP",
            {("fsdp_config", "fsdp_version"): 2, ("fsdp_config", "fsdp_auto_wrap_policy"): "TRANSFORMER_BASED_WRAP"},
        ),
    ],
)
def test_accelerate_configs(name, kind, checks):
    from accelerate.commands.config.config_args import ClusterConfig

    path = ACCELERATE / name
    raw = yaml.safe_load(path.read_text())
    assert raw["distributed_type"] == kind and raw["num_machines"] == 1 and raw["use_cpu"] is False
    for (section, key), value in checks.items():
        assert raw[section][key] == value, (name, section, key)
    cfg = ClusterConfig.from_yaml_file(str(path))  # accelerate's own loader accepts every key
    assert cfg.distributed_type.value == kind and cfg.num_processes == raw["num_processes"]
