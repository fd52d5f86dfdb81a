"""`echo-trl train`: TRL-style flags / YAML / PEFT, save_state + save_model (the CPU demo: test_demo.py)."""

from __future__ import annotations

import json

import pytest

from echo_trl.commands import train as train_cmd
from echo_trl.commands.cli import main as cli_main
from echo_trl.commands.support.checkpoints import resolve_checkpoint
from echo_trl.data.build import build_awm_dataset
from echo_trl.demo.episodes import synthetic_episodes, write_episodes
from echo_trl.errors import EchoTrlError

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
    return [
        "train",
        "--model_name_or_path",
        str(model),
        "--dataset_name",
        str(root / "train"),
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "2",
        "--num_generations",
        "2",
        "--use_cpu",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--max_completion_length",
        "1024",
        "--gradient_checkpointing",
        "false",
        "--dtype",
        "float32",
        "--disable_tqdm",
        "true",
        *extra,
    ]


def test_help_explains_offline_training_and_the_demo(capsys):
    assert cli_main(["train", "--help"]) == 0  # the short page: ECHO's flags first
    text = capsys.readouterr().out
    flag = lambda name: text.index(f"\n  --{name} ")  # noqa: E731 (a flag's own line, not a mention)
    assert flag("world_model_coeff") < flag("learning_rate") < text.index("`echo-trl train --help-all`.")
    for needle in (
        "--world_model_coeff",
        "--use_peft",
        "--dataset_name",
        "--config",
        "NO arguments",
        "demo",
        "--world_loss_temperature",
        "eval_world/ce_env",
    ):
        assert needle in text, needle
    with pytest.raises(SystemExit) as exc:  # every flag, TRL's included
        cli_main(["train", "--help-all"])
    assert exc.value.code == 0
    full = capsys.readouterr().out
    assert "--gradient_checkpointing" in full and "--gradient_checkpointing" not in text


def test_flags_without_a_model_say_what_to_add(capsys):
    """`echo-trl train --max_steps 1` is the demo's flag without --demo: the answer names --demo, not bf16."""
    for flags in (["--max_steps", "1"], ["--output_dir", "somewhere"]):
        assert cli_main(["train", *flags]) == 2
        err = capsys.readouterr().err
        assert f"`echo-trl train --demo {' '.join(flags)}`" in err and "--model_name_or_path MODEL" in err
        assert "bf16" not in err and len(err.strip().splitlines()) == 1


def test_trl_style_run_saves_state_and_model_and_reports_heldout_ce(assets, tmp_path, capsys):
    root, model, _ = assets
    yaml = tmp_path / "recipe.yaml"
    yaml.write_text("world_model_coeff: 0.07\nlearning_rate: 0.001\nlogging_steps: 1\n")
    out = tmp_path / "run"
    rc = cli_main(
        _flags(
            root,
            model,
            out,
            "--config",
            str(yaml),
            "--eval_strategy",
            "steps",
            "--eval_steps",
            "1",
            "--eval_dataset_name",
            str(root / "held"),
            "--per_device_eval_batch_size",
            "2",
        )
    )
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
    rc = cli_main(
        _flags(
            root,
            model,
            out,
            "--use_peft",
            "--lora_r",
            "4",
            "--lora_alpha",
            "8",
            "--lora_target_modules",
            "q_proj",
            "v_proj",
        )
    )
    assert rc == 0
    assert (out / "adapter_model.safetensors").exists() and (out / "trainer_state.json").exists()
    logs = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any(h.get("world/tokens_env", 0) > 0 and h.get("world/loss_scaled", 0) > 0 for h in logs)


def test_missing_dataset_is_a_usage_error(assets, tmp_path, capsys):
    _, model, _ = assets
    rc = cli_main(
        [
            "train",
            "--model_name_or_path",
            str(model),
            "--output_dir",
            str(tmp_path),
            "--use_cpu",
            "--report_to",
            "none",
        ]
    )
    assert rc == 2 and "--dataset_name is required" in capsys.readouterr().err


def test_invalid_training_arguments_are_a_usage_error_without_traceback(assets, tmp_path, capsys):
    root, model, _ = assets
    # GRPOConfig validates while parsing: 3 rows per step cannot form groups of 2 (a ValueError in TRL)
    rc = cli_main(_flags(root, model, tmp_path / "out", "--per_device_train_batch_size", "3"))
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("echo-trl train: error: invalid training arguments:")
    assert "generation_batch_size (3) must be divisible by num_generations (2)" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_behavior_policy_flag(assets, tmp_path, capsys):
    root, model, _ = assets
    with pytest.raises(SystemExit) as exc:
        cli_main(_flags(root, model, tmp_path / "bad", "--behavior_policy", "recorded"))
    assert exc.value.code == 2 and "invalid choice: 'recorded'" in capsys.readouterr().err
    out = tmp_path / "run"
    assert cli_main(_flags(root, model, out, "--behavior-policy", "current", "--logging_steps", "1")) == 0
    card = (out / "README.md").read_text()
    assert "| behaviour policy of recordings without log-probs (`behavior_policy`) | current |" in card


def test_config_file_errors_are_one_line(assets, tmp_path, capsys):
    root, model, _ = assets
    assert cli_main(_flags(root, model, tmp_path / "o", "--config", str(tmp_path / "missing.yaml"))) == 2
    assert capsys.readouterr().err == f"echo-trl train: error: --config {tmp_path / 'missing.yaml'}: no such file\n"
    bad = tmp_path / "bad.yaml"
    bad.write_text("world_model_coeff: [0.1\n")
    assert cli_main(_flags(root, model, tmp_path / "o", "--config", str(bad))) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"echo-trl train: error: --config {bad}: not readable YAML") and err.count("\n") == 1


def test_flags_are_never_abbreviated(assets, tmp_path, capsys):
    root, model, _ = assets
    # a usage error instead of silently --max_steps 3
    with pytest.raises(SystemExit) as exc:
        cli_main(_flags(root, model, tmp_path / "o", "--max_step", "3"))
    assert exc.value.code == 2 and "error: unrecognized arguments: --max_step 3 (" in capsys.readouterr().err
    parser = train_cmd.make_parser()  # the hyphen spelling is an alias of TRL's underscore one
    assert parser.parse_known_args(["--max-steps", "4", "--output_dir", "x"])[0].max_steps == 4


def test_max_completion_length_shorter_than_every_first_message_is_a_usage_error(assets, tmp_path, capsys):
    root, model, _ = assets
    rc = cli_main(_flags(root, model, tmp_path / "o", "--max_completion_length", "5"))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err  # was a torch RuntimeError
    assert "--max_completion_length 5 keeps no completion token of 12 of 12 trajectories" in err


def _checkpoint(path, step, complete=True):
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(path / "model.safetensors"))
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return path


def test_resume_true_is_the_latest_complete_checkpoint(tmp_path):
    out = tmp_path / "run"
    assert resolve_checkpoint("false", str(out)) is None and resolve_checkpoint(None, str(out)) is None
    with pytest.raises(EchoTrlError, match="no complete checkpoint-N in"):
        resolve_checkpoint("true", str(out))
    two = _checkpoint(out / "checkpoint-2", 2)
    _checkpoint(out / "checkpoint-10", 10)
    (out / "checkpoint-10" / "trainer_state.json").write_text('{"global_st')  # the save was cut mid-write
    _checkpoint(out / "checkpoint-12", 12, complete=False)  # Ctrl-C right after mkdir
    _checkpoint(out / "checkpoint-x", 0)
    for value in ("true", "True", True):
        assert resolve_checkpoint(value, str(out)) == str(two)
    assert resolve_checkpoint(str(two), str(out)) == str(two)
    with pytest.raises(EchoTrlError, match="checkpoint-12: incomplete checkpoint"):
        resolve_checkpoint(str(out / "checkpoint-12"), str(out))
    with pytest.raises(EchoTrlError, match="no such checkpoint directory"):
        resolve_checkpoint(str(out / "checkpoint-99"), str(out))


def test_resume_from_checkpoint_true_skips_an_interrupted_save(assets, tmp_path, monkeypatch):
    from echo_trl.trainer import EchoGRPOTrainer

    root, model, _ = assets
    out = tmp_path / "run"
    flags = ["--save_strategy", "steps", "--save_steps", "1", "--logging_steps", "1"]
    assert cli_main(_flags(root, model, out, *flags, "--max_steps", "2")) == 0
    for f in (out / "checkpoint-2").iterdir():  # what SIGINT during the save of step 2 leaves
        f.unlink() if f.is_file() else None
    (out / "checkpoint-2" / "trainer_state.json").unlink(missing_ok=True)
    seen = []
    real_train = EchoGRPOTrainer.train

    def train(self, resume_from_checkpoint=None, **kw):
        seen.append(resume_from_checkpoint)
        return real_train(self, resume_from_checkpoint=resume_from_checkpoint, **kw)

    monkeypatch.setattr(EchoGRPOTrainer, "train", train)
    assert cli_main(_flags(root, model, out, *flags, "--max_steps", "3", "--resume_from_checkpoint", "true")) == 0
    assert seen == [str(out / "checkpoint-1")]  # was: "true" taken as a path
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3]


def test_a_training_command_is_quiet_by_default(assets, tmp_path):
    """No library chatter the user cannot act on: no gradient_checkpointing FutureWarning (TRL's default,
    renamed by transformers), no progress bars for weight loading or shard writing (a blink of work)."""
    import os
    import subprocess
    import sys

    root, model, _ = assets
    proc = subprocess.run(
        [sys.executable, "-m", "echo_trl.commands.cli", *_flags(root, model, tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    for noise in ("FutureWarning", "gradient_checkpointing", "Loading weights", "Writing model shards", "Saving"):
        assert noise not in proc.stderr, proc.stderr


def test_the_step_bar_follows_the_terminal_rule_unless_asked(monkeypatch, tmp_path):
    from echo_trl.command_line import parse_command
    from echo_trl.commands.support.training_run import parse_training_flags

    base = ["--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", "o", "--use_cpu"]

    def disabled(*extra: str) -> bool:
        return parse_training_flags(train_cmd.make_parser(), [*base, *extra])[1].disable_tqdm

    monkeypatch.setenv("ECHO_TRL_PROGRESS", "0")  # as off a terminal
    assert disabled() and not disabled("--disable_tqdm", "false") and not disabled("--disable-tqdm=false")
    (tmp_path / "run.yaml").write_text("disable_tqdm: false\n")
    assert not disabled("--config", str(tmp_path / "run.yaml"))  # the config file's choice wins too
    monkeypatch.setenv("ECHO_TRL_PROGRESS", "1")  # as on a terminal: what transformers decides (its log level)
    assert disabled() == parse_command(train_cmd.make_parser(), base)[1].disable_tqdm
    assert disabled("--disable_tqdm", "true") and not disabled("--disable_tqdm", "false")
