"""examples/train_online_awm.py: one online ECHO step against the bundled AWM scenario (library_1), with LoRA.

TRL generates (a random tiny model, 16 tokens), each rollout runs in its own live AWM environment
(SQLite + generated MCP server), the verifier scores it, and the run saves an adapter and the model card.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,  # online trainings
    pytest.mark.sandbox,  # against AWM servers in bubblewrap
    pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning"),
]

REPO = Path(__file__).resolve().parents[2]


def _run_example(tmp_path, *args: str) -> dict:
    """Run examples/train_online_awm.py for one step with a tiny random model; the logged step."""
    from helpers.tiny import tiny_tokenizer

    from echo_trl.demo.tiny import build_tiny_model

    tok = tiny_tokenizer("qwen3")
    build_tiny_model(tok, "qwen3", hidden_size=32, num_layers=2, num_heads=4).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    spec = importlib.util.spec_from_file_location("train_online_awm", REPO / "examples" / "train_online_awm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = tmp_path / "out"
    rc = module.main(
        [
            "--model_name_or_path",
            str(tmp_path / "model"),
            "--output_dir",
            str(out),
            "--use_cpu",
            "true",
            "--bf16",
            "false",
            "--dtype",
            "float32",
            "--max_steps",
            "1",
            "--num_generations",
            "2",
            "--max_completion_length",
            "16",
            "--max_tool_calling_iterations",
            "1",
            "--report_to",
            "none",
            "--save_strategy",
            "no",
            "--gradient_checkpointing",
            "false",
            "--disable_tqdm",
            "true",
            "--logging_steps",
            "1",
            *args,
        ]
    )
    assert rc == 0
    logs = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return next(h for h in logs if "world/coeff" in h)


def test_one_online_step_with_lora(tmp_path):
    step = _run_example(
        tmp_path,
        "--awm_data",
        str(REPO / "data" / "awm_scenarios"),
        "--awm_scenario",
        "library_1",
        "--awm_tasks",
        "0",
        "1",
        "--per_device_train_batch_size",
        "2",
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
    )
    assert "rewards/AWMEnv_library_1/mean" in step  # the AWM verifier scored the rollouts
    out = tmp_path / "out"
    assert (out / "adapter_model.safetensors").exists()
    assert "## ECHO training" in (out / "README.md").read_text()


def test_one_online_run_trains_over_two_scenarios(tmp_path):
    """library_1 (bundled) + content_platform_1 (shared AWM-1K sample) in one run, one server pool."""
    from helpers.processes import descendant_pids
    from helpers.shared_data import AWM1K_SAMPLES, require_shared

    samples = require_shared(AWM1K_SAMPLES)
    children = descendant_pids()
    # 2 prompts (library_1 task 0, content_platform_1 task 0, interleaved) x 2 generations in one batch
    step = _run_example(
        tmp_path,
        "--awm_data",
        str(REPO / "data" / "awm_scenarios"),
        str(samples),
        "--awm_scenario",
        "library_1",
        "content_platform_1",
        "--awm_tasks",
        "0",
        "--awm_max_servers",
        "1",
        "--per_device_train_batch_size",
        "4",
    )
    for name in ("library_1", "content_platform_1"):  # each scenario's verifier scored its own rollouts
        value = step[f"rewards/AWMEnv_{name}/mean"]
        assert value == value  # not NaN: rollouts of this scenario were in the batch
    time.sleep(0.2)
    assert descendant_pids() - children == set()  # every server of the pool closed


def test_one_online_step_in_the_official_awm_agent_format(tmp_path):
    """--awm_format awm-agent: one environment class with list_tools/call_tool serves both scenarios."""
    from helpers.shared_data import AWM1K_SAMPLES, require_shared

    samples = require_shared(AWM1K_SAMPLES)
    step = _run_example(
        tmp_path,
        "--awm_format",
        "awm-agent",
        "--awm_data",
        str(REPO / "data" / "awm_scenarios"),
        str(samples),
        "--awm_scenario",
        "library_1",
        "content_platform_1",
        "--awm_tasks",
        "0",
        "--per_device_train_batch_size",
        "4",
    )
    assert step["rewards/AWMAgentEnv/mean"] == step["rewards/AWMAgentEnv/mean"]  # scored, not NaN
