"""`echo-trl sft`: TRL-style flags / YAML / PEFT like `echo-trl train`, reward filtering, the model card, and a
Hub-shaped tool-use `messages` dataset trained with observation supervision in one command."""

from __future__ import annotations

import json

import pytest

from echo_trl.commands.cli import main as cli_main
from echo_trl.data.build import build_awm_dataset
from echo_trl.demo.episodes import synthetic_episodes, write_episodes

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny model directory and train / held-out trajectory datasets (synthetic AWM-style episodes)."""
    from echo_trl.demo.tiny import ensure_tiny_model

    root = tmp_path_factory.mktemp("sftcli")
    episodes = write_episodes(synthetic_episodes(n_tasks=4, per_task=4), root / "eps.jsonl")
    ds = build_awm_dataset([episodes])
    train = ds.filter(lambda r: r["task_idx"] != 3)
    held = ds.filter(lambda r: r["task_idx"] == 3)
    train.save_to_disk(str(root / "train"))
    held.save_to_disk(str(root / "held"))
    corpus = [m["content"] for row in ds for m in row["completion"]]
    model = ensure_tiny_model(root / "model", family="qwen3", corpus=corpus, vocab_size=800, hidden_size=32)
    return root, model, list(train["reward"])


def _flags(root, model, out, *extra):
    return [
        "sft",
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
        "--use_cpu",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--gradient_checkpointing",
        "false",
        "--dtype",
        "float32",
        "--disable_tqdm",
        "true",
        *extra,
    ]


def test_help_explains_the_weights_and_the_filter(capsys):
    assert cli_main(["sft", "--help"]) == 0  # the short page: ECHO's flags first, then TRL's most used
    text = capsys.readouterr().out
    flag = lambda name: text.index(f"\n  --{name} ")  # noqa: E731 (a flag's own line, not a mention)
    assert flag("action_weight") < flag("learning_rate") < text.index("`echo-trl sft --help-all`.")
    for needle in (
        "--observation_weight",
        "--action_weight",
        "--min_reward",
        "--world_all_episodes",
        "--use_peft",
        "--config",
        "sum_t w_t * CE_t / sum_t w_t",
        "--compare",
        "echo-trl train --model_name_or_path OUTPUT_DIR",
    ):
        assert needle in text, needle
    assert cli_main(["--help"]) == 0 and "  sft " in capsys.readouterr().out


def test_run_with_yaml_saves_state_model_and_a_card_naming_the_stage_and_weights(assets, tmp_path, capsys):
    root, model, rewards = assets
    yaml = tmp_path / "recipe.yaml"
    yaml.write_text("observation_weight: 0.5\naction_weight: 2.0\nlearning_rate: 0.001\nlogging_steps: 1\n")
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
    logs = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert any(h.get("sft/tokens_env", 0) > 0 and "sft/ce_action" in h for h in logs)
    assert any("eval_sft/ce_env" in h for h in logs)
    assert (out / "model.safetensors").exists()
    card = (out / "README.md").read_text()
    assert "## ECHO SFT stage" in card and "| stage | SFT (`EchoSFTTrainer`), before ECHO-GRPO |" in card
    assert (
        "| assistant tokens TRL trains (`action_weight`) | 2 |" in card
        and "| tool-message content tokens (`observation_weight`) | 0.5 |" in card
    )
    printed = capsys.readouterr().out
    assert f"all {len(rewards)} episodes trained" in printed and "held-out CE" in printed


@pytest.mark.parametrize("world_all", [False, True])
def test_min_reward_reports_the_kept_rows_in_one_line(assets, tmp_path, capsys, world_all):
    root, model, rewards = assets
    kept = sum(r >= 1.0 for r in rewards)
    assert 0 < kept < len(rewards)  # the fixture has both
    extra = ["--min_reward", "1.0", *(["--world_all_episodes", "true"] if world_all else [])]
    assert cli_main(_flags(root, model, tmp_path / "o", *extra)) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "--min_reward" in ln]
    assert len(lines) == 1
    assert f"keeps {kept} of {len(rewards)} episodes" in lines[0]
    assert ("--world_all_episodes" in lines[0]) == world_all
    card = (tmp_path / "o" / "README.md").read_text()
    assert "| episodes (`min_reward`) | reward >= 1 |" in card


def test_use_peft_saves_an_adapter(assets, tmp_path):
    root, model, _ = assets
    out = tmp_path / "lora"
    flags = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
    assert cli_main(_flags(root, model, out, *flags)) == 0
    assert (out / "adapter_model.safetensors").exists() and (out / "trainer_state.json").exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--min_reward", "5"], "no episode has reward >= 5"),
        (["--observation_weight", "-1"], "observation_weight must be a finite number >= 0"),
        (["--world_all_episodes", "true"], "world_all_episodes needs min_reward"),
        (["--max_step", "3"], "unrecognized arguments: --max_step 3"),
    ],
)
def test_bad_settings_are_one_line_usage_errors(assets, tmp_path, capsys, extra, needle):
    root, model, _ = assets
    try:
        code = cli_main(_flags(root, model, tmp_path / "o", *extra))
    except SystemExit as exc:  # a flag the parser does not know: argparse's exit
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("echo-trl sft: error:") and needle in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_compare_has_its_own_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["sft", "--compare", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for needle in ("--sft_steps", "--grpo_steps", "--min_reward", "--observation_weight", "--world_all_episodes"):
        assert needle in text, needle
    assert "--actobs_coeff" not in text and "lambda of the ECHO-GRPO stage" in text


def test_compare_refuses_a_bad_value_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["sft", "--compare", "--sft_steps", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--sft_steps" in err and err.count("\n") == 1


def test_a_hub_shaped_tool_use_messages_dataset_trains_with_observation_supervision(assets, tmp_path, capsys):
    """One command on a local `messages` dataset with tool calls (the shape of a Hub tool-calling dataset): the
    tool outputs are trained (sft/tokens_env), and the same data at observation_weight 0 trains none of them."""
    from helpers.sft import tool_messages

    _, model, _ = assets
    data = tmp_path / "toolcalls"
    tool_messages(4).save_to_disk(str(data))
    runs = {}
    for weight in ("1", "0"):
        out = tmp_path / f"w{weight}"
        flags = _flags(tmp_path, model, out, "--observation_weight", weight, "--assistant_only_loss", "true")
        flags[flags.index("--dataset_name") + 1] = str(data)
        assert cli_main(flags) == 0, capsys.readouterr().err
        runs[weight] = json.loads((out / "trainer_state.json").read_text())["log_history"][0]
    assert runs["1"]["sft/tokens_env"] > 0 and runs["1"]["sft/ce_env"] > 0
    assert runs["0"].get("sft/tokens_env", 0) == 0 and "sft/ce_action" in runs["0"]


def test_compare_runs_every_stage_at_its_thread_count_and_puts_torchs_back(monkeypatch, tmp_path, capsys):
    """As the demo: the table's numbers depend on torch's thread count, so the comparison pins it (default 1) for
    its whole run, the warm-up included (a cached warm-up is per count)."""
    import torch

    from echo_trl.demo import two_stage, warmup

    class Stop(Exception):
        pass

    seen = []

    def warm_up(base, train, settings, log):
        seen.append((torch.get_num_threads(), settings.threads))
        raise Stop

    monkeypatch.setattr(two_stage, "_episodes", lambda args: (["t"] * 4, ["h"], "data/episodes"))
    monkeypatch.setattr(two_stage, "tiny_model_for", lambda rows, cache: tmp_path / "tiny")
    monkeypatch.setattr(warmup, "warm_up_tiny_model", warm_up)
    before = torch.get_num_threads()
    for argv, expected in (([], 1), (["--threads", "2"], 2)):
        with pytest.raises(Stop):
            two_stage.main(["--output_dir", str(tmp_path / f"out{expected}"), *argv])
        assert seen[-1] == (expected, expected) and torch.get_num_threads() == before
    with pytest.raises(SystemExit) as exc:
        cli_main(["sft", "--compare", "--threads", "0"])
    assert exc.value.code == 2 and "--threads" in capsys.readouterr().err
