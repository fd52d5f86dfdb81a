"""Held-out env-token CE: library function and `echo-trl eval-world-model` (JSON on stdout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers.docs import cli_in_process
from helpers.terminal import pretend_terminal

from echo_trl.commands.cli import main as cli_main
from echo_trl.data.build import trajectories_to_dataset
from echo_trl.roles import Trajectory, tool_call
from echo_trl.tokens.tokenization import tokenize_with_roles
from echo_trl.train.world_eval import evaluate_world_model

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _traj(i: int, scenario: str) -> Trajectory:
    return Trajectory(
        prompt=[{"role": "user", "content": f"Find order {i}."}],
        completion=[
            {"role": "assistant", "content": "", "tool_calls": [tool_call("get_order", {"id": i})]},
            {"role": "tool", "name": "get_order", "content": f'{{"id": {i}, "status": "shipped", "n": {i * 7}}}'},
            {"role": "assistant", "content": "", "tool_calls": [tool_call("verify", {})]},
            {"role": "tool", "name": "verify", "content": "complete" if i % 2 else "incomplete"},
        ],
        warnings=[[], ["slow"] if i == 0 else [], [], []],
        reward=1.0,
        scenario=scenario,
        task_idx=i,
    )


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    from echo_trl.demo.tiny import ensure_tiny_model

    root = tmp_path_factory.mktemp("evalwm")
    model_dir = ensure_tiny_model(root / "model", family="qwen3", vocab_size=600, hidden_size=32)
    ds = trajectories_to_dataset([_traj(i, "shop" if i < 3 else "mail") for i in range(5)])
    ds.save_to_disk(str(root / "data"))
    return model_dir, root / "data", ds


def _reference(model, tok, ds):
    """Full-logits teacher-forced CE of env tokens, computed independently of world_eval."""
    nll, n, per = 0.0, 0, {}
    for row in ds:
        t = tokenize_with_roles(tok, row)
        ids = torch.tensor([t.input_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        lp = logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        env = torch.tensor(t.env_output_mask[1:], dtype=torch.bool)
        s, k = float(-lp[env].sum()), int(env.sum())
        nll, n = nll + s, n + k
        a, b = per.get(row["scenario"], (0.0, 0))
        per[row["scenario"]] = (a + s, b + k)
    return nll / n, n, {k: v[0] / v[1] for k, v in per.items()}


def test_evaluate_world_model_matches_full_logits_reference(model_and_data):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, _, ds = model_and_data
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    out = evaluate_world_model(model, tok, ds)
    ce, n, per = _reference(model, tok, ds)
    assert out["ce_env"] == pytest.approx(ce, rel=1e-5) and out["tokens_env"] == n
    assert {k: v["ce_env"] for k, v in out["by_scenario"].items()} == pytest.approx(per, rel=1e-5)
    assert out["by_scenario"]["shop"]["trajectories"] == 3 and out["trajectories"] == 5
    assert out["tokens_warning"] > 0 and out["ce_warning"] > 0


def test_cli_json_and_text(model_and_data, capsys):
    model_dir, data_dir, _ = model_and_data
    assert cli_main(["eval-world-model", "--model", str(model_dir), "--dataset", str(data_dir), "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out)
    assert out.count("\n") == 1 and {"ce_env", "tokens_env", "by_scenario"} <= set(result)
    assert set(result["by_scenario"]) == {"shop", "mail"}
    assert cli_main(["eval-world-model", "--model", str(model_dir), "--dataset", str(data_dir), "--limit", "2"]) == 0
    text = capsys.readouterr().out
    assert f"env-token CE on {data_dir}: " in text and "nats/token" in text and "2 trajectories" in text
    assert "held-out" not in text  # the dataset is named: it is held out only if the user says so


def test_cli_bad_model_is_exit_2(model_and_data, tmp_path, capsys):
    _, data_dir, _ = model_and_data
    assert cli_main(["eval-world-model", "--model", str(tmp_path / "nope"), "--dataset", str(data_dir)]) == 2
    assert f"model {tmp_path / 'nope'}: no such file or directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli_main(["eval-world-model", "--model", str(tmp_path / "empty"), "--dataset", str(data_dir)]) == 2
    assert f"cannot load model {tmp_path / 'empty'}: " in capsys.readouterr().err


def test_stdout_is_exactly_one_json_object_in_a_real_process(model_and_data):
    model_dir, data_dir, _ = model_and_data
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "echo_trl.commands.cli",
            "eval-world-model",
            "--model",
            str(model_dir),
            "--dataset",
            str(data_dir),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens_env"] > 0  # the whole stdout is one JSON document


def test_local_model_directory_is_never_probed_on_the_hub(model_and_data, monkeypatch, capsys):
    """A full model directory is not a PEFT adapter because it has no adapter_config.json: the Hub is not asked
    (before, PEFT looked the file up on the Hub for every run: ~30 s of retries without network)."""
    model_dir, data_dir, _ = model_and_data
    argv = ["eval-world-model", "--model", model_dir, "--dataset", data_dir, "--json"]
    code, out, err, guard = cli_in_process(argv, monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(out)["tokens_env"] > 0 and guard.count == 0, guard.attempts


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_the_cache_build_and_the_evaluation_show_bars_on_a_terminal_only(
    model_and_data, capsys, monkeypatch, terminal
):
    model_dir, data_dir, ds = model_and_data
    pretend_terminal(monkeypatch, terminal)
    assert cli_main(["eval-world-model", "--model", str(model_dir), "--dataset", str(data_dir)]) == 0
    err = capsys.readouterr().err
    rows = f"{len(ds)}/{len(ds)}"
    assert ("tokenizing trajectories" in err and "eval env CE: 100%" in err and err.count(rows) >= 2) is terminal
    if not terminal:
        assert err == ""
    assert cli_main(["eval-world-model", "--model", str(model_dir), "--dataset", str(data_dir), "--json"]) == 0
    assert capsys.readouterr().err == ""  # --json: one object on stdout, no bar either
