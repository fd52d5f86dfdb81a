"""Damaged checkpoints: every file a resume loads is checked; ``true`` skips damaged ones and says so, a named
damaged one is one line; a checkpoint save that fills the disk is one line and leaves no cut checkpoint."""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest
import torch
from helpers.tiny import tiny_model
from helpers.tmpfs import small_tmpfs
from helpers.trainer import dataset, make_trainer
from safetensors import SafetensorError
from safetensors.torch import load_file

from echo_trl.commands.cli import main as cli_main
from echo_trl.commands.support.checkpoints import checkpoint_problem, checkpoint_saves, resolve_checkpoint
from echo_trl.demo.tiny import ensure_tiny_model
from echo_trl.errors import EchoTrlError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real run's output: checkpoint-1 and checkpoint-2 of a tiny model (weights, optimizer, scheduler, RNG,
    the generation buffer, trainer_state.json)."""
    out = tmp_path_factory.mktemp("ckpt") / "run"
    trainer = make_trainer(out, dataset(4), save_strategy="steps", save_steps=1, max_steps=2)
    trainer.train()
    return out


@pytest.fixture
def out(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _loads(path) -> bool:
    """The independent check: does the library that reads the file at resume load it?"""
    try:
        if path.suffix == ".safetensors":
            load_file(str(path))
        else:
            torch.load(path, weights_only=False)
    except (RuntimeError, OSError, EOFError, zipfile.BadZipFile, SafetensorError, ValueError):
        return False
    return True


def test_a_whole_checkpoint_is_complete_and_its_files_load(out):
    for name in ("checkpoint-1", "checkpoint-2"):
        assert checkpoint_problem(out / name) is None
        for f in (out / name).iterdir():
            if f.suffix in (".safetensors", ".pt", ".pth"):
                assert _loads(f), f
    assert resolve_checkpoint("true", str(out)) == str(out / "checkpoint-2")


@pytest.mark.parametrize(
    "name", ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "echo_generation_buffer_0.pt"]
)
def test_a_truncated_file_is_named_and_skipped(out, name, capsys):
    damaged = out / "checkpoint-2" / name
    assert damaged.is_file(), sorted(p.name for p in damaged.parent.iterdir())
    _truncate(damaged)
    assert not _loads(damaged)  # resuming from it would fail
    problem = checkpoint_problem(out / "checkpoint-2")
    assert problem and problem.startswith(f"{name} is truncated"), problem
    assert resolve_checkpoint("true", str(out)) == str(out / "checkpoint-1")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "skipped incomplete checkpoint-2" in err and name in err, err
    with pytest.raises(EchoTrlError, match=rf"checkpoint-2: incomplete checkpoint: {name} is truncated") as info:
        resolve_checkpoint(str(out / "checkpoint-2"), str(out))
    assert "\n" not in str(info.value)


def test_a_damaged_safetensors_header_and_a_padded_file_are_named(out):
    weights = out / "checkpoint-2" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:16] = b"\xff" * 8  # the JSON header's first bytes
    weights.write_bytes(bytes(data))
    assert not _loads(weights)
    assert "model.safetensors is unreadable header" in checkpoint_problem(out / "checkpoint-2")
    other = out / "checkpoint-1" / "model.safetensors"
    other.write_bytes(other.read_bytes() + b"\0" * 100)  # a copy that appended garbage
    assert not _loads(other)
    assert "model.safetensors is too long" in checkpoint_problem(out / "checkpoint-1")


@pytest.mark.parametrize("step", ["2", "two", None, 2.5, True, -1])
def test_a_non_numeric_global_step_is_incomplete(out, step):
    state_file = out / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["global_step"] = step
    state_file.write_text(json.dumps(state))
    expected = f"trainer_state.json: global_step is {step!r}, not a step number"
    assert checkpoint_problem(out / "checkpoint-2") == expected
    assert resolve_checkpoint("true", str(out)) == str(out / "checkpoint-1")


def test_missing_weights_and_missing_shards_are_named(out):
    (out / "checkpoint-2" / "model.safetensors").unlink()
    assert checkpoint_problem(out / "checkpoint-2").startswith("no model weights")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (out / "checkpoint-2" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "shard model-00001-of-00002.safetensors is missing" in checkpoint_problem(out / "checkpoint-2")


def test_a_lora_adapter_checkpoint_is_checked(tmp_path):
    from peft import LoraConfig, get_peft_model

    ckpt = tmp_path / "run" / "checkpoint-3"
    model = get_peft_model(tiny_model(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(ckpt)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    assert checkpoint_problem(ckpt) is None
    _truncate(ckpt / "adapter_model.safetensors", 0.9)
    assert checkpoint_problem(ckpt).startswith("adapter_model.safetensors is truncated")
    (ckpt / "adapter_model.safetensors").unlink()
    model.save_pretrained(ckpt)
    (ckpt / "adapter_config.json").unlink()
    assert checkpoint_problem(ckpt).startswith("adapter_config.json: missing")


@pytest.fixture(scope="module")
def cli_assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt_cli")
    dataset(4).save_to_disk(str(root / "train"))
    model = ensure_tiny_model(root / "model", family="qwen3", vocab_size=400, hidden_size=32)
    return root, model


def _train(root, model, out, *extra):
    flags = ["--model_name_or_path", str(model), "--dataset_name", str(root / "train"), "--output_dir", str(out)]
    flags += [
        "--per_device_train_batch_size",
        "2",
        "--num_generations",
        "2",
        "--use_cpu",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
    ]
    return cli_main(["train", *flags, "--max_steps", "1", *extra])


def test_cli_resume_from_a_named_damaged_checkpoint_is_one_line_exit_2(out, cli_assets, capsys):
    root, model = cli_assets
    _truncate(out / "checkpoint-2" / "optimizer.pt")
    assert _train(root, model, out, "--resume_from_checkpoint", str(out / "checkpoint-2")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "checkpoint-2: incomplete checkpoint: optimizer.pt is truncated" in err


def test_cli_checkpoint_save_on_a_full_disk_is_one_line_and_leaves_no_cut_checkpoint(cli_assets, tmp_path, capsys):
    root, model = cli_assets
    with small_tmpfs(tmp_path / "small", 160 * 1024) as disk:
        out = disk / "run"
        rc = _train(root, model, out, "--save_strategy", "steps", "--save_steps", "1")
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"{out / 'checkpoint-1'}: no space left on device (needs about" in err
        assert not (out / "checkpoint-1").exists()
        assert not [p.name for p in out.iterdir() if p.name.startswith(("tmp", "checkpoint-"))]


def test_a_failure_that_is_not_a_full_disk_is_left_alone(tmp_path):
    model = tiny_model()
    (tmp_path / "checkpoint-1").mkdir(parents=True)
    with pytest.raises(ZeroDivisionError), checkpoint_saves(str(tmp_path), model):
        (tmp_path / "checkpoint-2").mkdir()
        raise ZeroDivisionError  # plenty of space where the checkpoint goes: not a disk-full error
    assert (tmp_path / "checkpoint-2").is_dir()


def test_cli_final_save_on_a_full_disk_is_one_line(cli_assets, tmp_path, capsys):
    root, model = cli_assets
    with small_tmpfs(tmp_path / "small", 96 * 1024) as disk:
        out = disk / "run"
        rc = _train(root, model, out, "--save_strategy", "no")
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"{out}: no space left on device (needs about" in err and "the final model there is incomplete" in err
