"""`echo-trl train`: TRL-style flags / YAML / PEFT, save_state + save_model (the CPU demo: test_demo.py)."""

from __future__ import annotations

import json

import pytest

from echo_trl.cli import main as cli_main
from echo_trl.dataset import build_awm_dataset
from echo_trl.demo.episodes import synthetic_episodes, write_episodes

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny model directory and train / held-out trajectory datasets (synthetic AWM-style episodes)."""
    from echo_trl.demo.tiny import ensure_tiny_model

    root = tmp_path_factory.mktemp("traincli")
    episodes = write_episodes(synthetic_episodes(n_tasks=4, per_task=4), root / "eps.jsonl")
    ds = build_awm_dataset([episodes])
    train = ds.filter(lambda r: r["task_idx"] != 3)
    held = ds.filter(lambda r: r["task_idx"] == 3)
    train.save_to_disk(str(root / "train"))
    held.save_to_disk(str(root / "held"))
    corpus = [m["content"] for row in ds for m in row["completion"]]
    model = ensure_tiny_model(root / "model", family="qwen3", corpus=corpus, vocab_size=800, hidden_size=32)
    return root, model, episodes


def _flags(root, model, out, *extra):
    return ["train", "--model_name_or_path", str(model), "--dataset_name", str(root / "train"),
            "--output_dir", str(out), "--max_steps", "1", "--per_device_train_batch_size", "2",
            "--num_generations", "2", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
            "--max_completion_length", "1024", "--gradient_checkpointing", "false", "--dtype", "float32",
            "--disable_tqdm", "true", *extra]


def test_help_explains_offline_training_and_the_demo(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["train", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for needle in ("--world_model_coeff", "--use_peft", "--dataset_name", "--config", "NO arguments", "demo",
                   "--world_loss_temperature", "eval_world/ce_env"):
        assert needle in text, needle


def test_trl_style_run_saves_state_and_model_and_reports_heldout_ce(assets, tmp_path, capsys):
    root, model, _ = assets
    yaml = tmp_path / "recipe.yaml"
    yaml.write_text("world_model_coeff: 0.07\nlearning_rate: 0.001\nlogging_steps: 1\n")
    out = tmp_path / "run"
    rc = cli_main(_flags(root, model, out, "--config", str(yaml), "--eval_strategy", "steps", "--eval_steps", "1",
                         "--eval_dataset_name", str(root / "held"), "--per_device_eval_batch_size", "2"))
    assert rc == 0
    state = json.loads((out / "trainer_state.json").read_text())
    logs = state["log_history"]
    assert any(h.get("world/coeff") == 0.07 for h in logs)
    assert any("eval_world/ce_env" in h for h in logs)
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    assert "held-out env CE" in capsys.readouterr().out


def test_use_peft_saves_an_adapter(assets, tmp_path):
    root, model, _ = assets
    out = tmp_path / "lora"
    rc = cli_main(_flags(root, model, out, "--use_peft", "--lora_r", "4", "--lora_alpha", "8",
                         "--lora_target_modules", "q_proj", "v_proj"))
    assert rc == 0
    assert (out / "adapter_model.safetensors").exists() and (out / "trainer_state.json").exists()
    logs = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any(h.get("world/tokens_env", 0) > 0 and h.get("world/loss_scaled", 0) > 0 for h in logs)


def test_missing_dataset_is_a_usage_error(assets, tmp_path, capsys):
    _, model, _ = assets
    rc = cli_main(["train", "--model_name_or_path", str(model), "--output_dir", str(tmp_path), "--use_cpu",
                   "--report_to", "none"])
    assert rc == 2 and "--dataset_name is required" in capsys.readouterr().err


def test_invalid_training_arguments_are_a_usage_error_without_traceback(assets, tmp_path, capsys):
    root, model, _ = assets
    # GRPOConfig validates while parsing: 3 rows per step cannot form groups of 2 (a ValueError in TRL)
    rc = cli_main(_flags(root, model, tmp_path / "out", "--per_device_train_batch_size", "3"))
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("echo-trl train: error: invalid training arguments:")
    assert "generation_batch_size (3) must be divisible by num_generations (2)" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
