"""`echo-trl train` under real data parallelism: `accelerate launch --multi_gpu --num_processes 2` on CPU.

Two CPU processes (gloo) train a tiny local model offline for a few steps; the same global batch is
trained once more in one process. Checks: both ranks end with identical parameters, the logged world
metrics are global (summed over both ranks' data, recomputed here with ``tokenize_with_roles``), and
the first-step loss (and the final model) match the one-process run within float tolerance, and
the held-out ``eval_world/ce_env`` of the untouched model (``--eval_on_start``, 5 trajectories: the
2 x 2 sharded eval loader repeats 3 of them to even out its last batch) equals the one-process value.

The per-rank parameters come from a ``sitecustomize`` probe put on ``PYTHONPATH`` for the launched
processes only (``helpers.launch.PROBE``): it wraps ``EchoGRPOTrainer.save_model`` to dump each rank's
parameters. Nothing in ``echo_trl`` is changed for the test. The launcher is the running interpreter's
accelerate (``python -m accelerate.commands.launch``): never a skip for one missing on PATH.

The same launch shows it ends cleanly: every rank left the process group, and only after the DDP model was
collected (a rank once hung in DDP's teardown after the work was done; the DeepSpeed launches of
tests/test_deepspeed.py check their exit the same way). The launch refusals are unit tests
(tests/commands/support/test_launch_checks.py); here, in this process, ``echo-trl train`` makes them first, in the
environment accelerate gives a rank, as one line and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers.launch import CONFIGS, accelerate_launch, launch_env, run, single_process, write_probe

from echo_trl.data.build import build_awm_dataset
from echo_trl.data.store import load_echo_dataset, save_dataset
from echo_trl.demo.episodes import synthetic_episodes, write_episodes

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

MAX_COMPLETION = 1024
STEPS = 2
EVAL_ROWS, EVAL_BATCH = 5, 2  # 2 processes x 2 per device: the last eval batch holds 1 real row, 3 repeats


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny local model, an 8-trajectory dataset directory (build_awm_dataset + save_dataset) and a
    5-trajectory held-out one."""
    from echo_trl.demo.tiny import ensure_tiny_model

    root = tmp_path_factory.mktemp("ddp")
    episodes = write_episodes(synthetic_episodes(n_tasks=2, per_task=4, seed=1), root / "eps.jsonl")
    ds = build_awm_dataset([episodes])
    assert len(ds) == 8
    save_dataset(ds, root / "data")
    held = build_awm_dataset(
        [write_episodes(synthetic_episodes(n_tasks=1, per_task=EVAL_ROWS, seed=2), root / "held.jsonl")]
    )
    assert len(held) == EVAL_ROWS
    save_dataset(held, root / "held")
    corpus = [m["content"] for row in [*ds, *held] for m in row["completion"]]
    model = ensure_tiny_model(root / "model", family="qwen3", corpus=corpus, vocab_size=600, hidden_size=32)
    return root, model, write_probe(root)


def _train_flags(
    root: Path, model: Path, out: Path, per_device: int, *, use_cpu: bool = True, evaluate: bool = True, steps=STEPS
) -> list[str]:
    flags = [
        "train",
        *("--model_name_or_path", str(model), "--dataset_name", str(root / "data"), "--output_dir", str(out)),
        *("--max_steps", str(steps), "--per_device_train_batch_size", str(per_device), "--num_generations", "2"),
        *(["--use_cpu", "true"] if use_cpu else []),
        *("--bf16", "false", "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1"),
        *("--max_completion_length", str(MAX_COMPLETION), "--gradient_checkpointing", "false"),
        *("--dtype", "float32", "--disable_tqdm", "true", "--learning_rate", "1e-3", "--world_model_coeff", "0.05"),
        *("--seed", "0"),
    ]
    if evaluate:  # held-out CE of the initial model only (eval_steps past max_steps)
        flags += ["--eval_strategy", "steps", "--eval_on_start", "true", "--eval_steps", "1000"]
        flags += ["--eval_dataset_name", str(root / "held"), "--per_device_eval_batch_size", str(EVAL_BATCH)]
    return flags


def _logs(out: Path, key: str = "loss") -> list[dict]:
    return [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if key in h]


DDP_LAUNCH = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
DDP_LAUNCH += ["--dynamo_backend", "no"]


@pytest.fixture(scope="module")
def runs(assets):
    """The two-process DDP run and the one-process run of the same global batch: ``(output_dir, probe_dir)``."""
    root, model, probe = assets
    results = {}
    for name, launcher, per_device in [
        ("ddp", accelerate_launch(*DDP_LAUNCH), 4),
        ("single", single_process(), 8),
    ]:
        probe_out = root / f"probe_{name}"
        probe_out.mkdir(exist_ok=True)
        # the probe dumps rank0.pt for the one-process run too
        env = launch_env(probe, probe_out, ACCELERATE_USE_CPU="true", **({"RANK": "0"} if name == "single" else {}))
        out = root / name
        # a hang at exit shows as the timeout (the work itself takes well under a minute)
        proc, _ = run([*launcher, *_train_flags(root, model, out, per_device)], env, root, timeout=600)
        assert proc.returncode == 0, f"{name} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        results[name] = (out, probe_out)
    return results


@pytest.mark.slow
def test_both_ranks_hold_identical_parameters(runs):
    _, probe_out = runs["ddp"]
    r0, r1 = torch.load(probe_out / "rank0.pt"), torch.load(probe_out / "rank1.pt")
    assert r0["world_size"] == r1["world_size"] == 2  # really two processes, not one CPU process
    assert r0["params"].keys() == r1["params"].keys() and r0["params"]
    for name in r0["params"]:
        assert torch.equal(r0["params"][name], r1["params"][name]), name


@pytest.mark.slow
def test_world_metrics_are_global_token_counts(assets, runs):
    from transformers import AutoTokenizer

    from echo_trl.tokens.tokenization import tokenize_with_roles

    root, model, _ = assets
    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = list(load_echo_dataset(root / "data"))
    env = action = 0
    for row in rows:
        tokens = tokenize_with_roles(tokenizer, row)
        assert tokens.truncated_tokens == 0 and len(tokens) - tokens.prompt_length <= MAX_COMPLETION
        env += sum(tokens.env_output_mask)
        action += sum(tokens.action_mask)
    assert env > 0
    # per_device 4 x 2 ranks = the 8 trajectories: each optimizer step sees the whole dataset once
    for name in ("ddp", "single"):
        logs = _logs(runs[name][0])
        assert len(logs) == STEPS
        for h in logs:
            assert h["world/tokens_env"] == env, (name, h["world/tokens_env"], env)
            assert h["world/tokens_action"] >= action  # action tokens + the end-of-turn tokens TRL trains


@pytest.mark.slow
def test_first_step_loss_and_final_model_match_one_process(runs):
    ddp, single = _logs(runs["ddp"][0]), _logs(runs["single"][0])
    for key in ("loss", "world/ce_env", "world/loss_unscaled", "world/tokens_action"):
        assert ddp[0][key] == pytest.approx(single[0][key], rel=1e-4, abs=1e-6), key
    # later steps agree too: the parameters after step 1 are the same up to float reduction order
    assert ddp[-1]["loss"] == pytest.approx(single[-1]["loss"], rel=1e-4)
    a = torch.load(runs["ddp"][1] / "rank0.pt")["params"]
    b = torch.load(runs["single"][1] / "rank0.pt")["params"]
    for name in a:
        # Adam divides by sqrt(v): an entry whose gradient is ~0 in both runs can move by up to lr (1e-3) on
        # float noise alone, so the tolerance is a tenth of lr rather than float epsilon
        torch.testing.assert_close(a[name], b[name], rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.slow
def test_heldout_env_ce_counts_each_trajectory_once(assets, runs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from echo_trl.train.world_eval import trajectory_env_nll

    root, model_dir, _ = assets
    # the evaluation before the first step (Trainer evaluates once more after the last one)
    ddp, single = (
        [h for h in _logs(runs[name][0], "eval_world/ce_env") if h["step"] == 0] for name in ("ddp", "single")
    )
    assert len(ddp) == len(single) == 1
    # Same initial weights and per-row float32 sums; only batch composition (padding) and the order of the
    # float64 accumulation may differ, a few float32 ulps (~1e-7 relative): 1e-6 leaves margin, and the
    # repeats counted twice moved it by ~1e-4 (below).
    assert ddp[0]["eval_world/ce_env"] == pytest.approx(single[0]["eval_world/ce_env"], rel=1e-6)
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    # evaluate_world_model's per-trajectory sums: an independent forward (no padding, only the env positions)
    per_row = [
        trajectory_env_nll(model, tok, row, max_completion_length=MAX_COMPLETION)
        for row in load_echo_dataset(root / "held")
    ]
    ce = lambda rs: sum(r["env_nll"] for r in rs) / sum(r["env_tokens"] for r in rs)  # noqa: E731
    assert single[0]["eval_world/ce_env"] == pytest.approx(ce(per_row), rel=1e-5)
    # the repeats accelerate pads the last batch with (rows 0-2), counted twice, move the CE well past that
    assert ce(per_row + per_row[:3]) != pytest.approx(ce(per_row), rel=1e-4)


@pytest.mark.slow
def test_the_launch_left_the_process_group_after_the_ddp_model_was_collected(runs):
    """Each rank destroyed the group at the end (the teardown every exit path takes), with the DDP model, whose
    reducer waits on gloo's threads, already collected: the order that cannot hang."""
    _, probe_out = runs["ddp"]
    for rank in (0, 1):
        teardown = json.loads((probe_out / f"teardown{rank}.json").read_text())
        assert teardown["wrapped_alive"] == [False], rank


# --------------------------------------------------------------------------------------------
# Launches that would silently run something else are refused, in one line, exit 2: checked before anything
# loads (the model and dataset named here do not exist), in the environment accelerate gives each rank


def _refused(tmp_path, capsys, monkeypatch, env: dict[str, str], flags: list[str]) -> str:
    from echo_trl.commands.cli import main as cli_main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    missing, out = tmp_path / "no-such-model", tmp_path / "out"
    argv = [*_train_flags(missing, missing, out, 4, use_cpu=False, evaluate=False), *flags]
    assert cli_main(argv) == 2  # echo-trl's usage-error status
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("echo-trl train: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert not out.exists()
    return lines[0]


def test_a_config_precision_the_flags_contradict_is_refused_first(tmp_path, capsys, monkeypatch):
    """The shipped GPU config's bf16 against ``--bf16 false``. A rank launched with DeepSpeed has its process
    group before this check runs, which one process cannot have: the DeepSpeed variant of the refusal is
    test_launch_checks.py::test_a_precision_mismatch_names_both_sides."""
    config = yaml.safe_load((CONFIGS / "deepspeed_zero3.yaml").read_text())
    assert config["mixed_precision"] == "bf16"
    env = {"ACCELERATE_MIXED_PRECISION": config["mixed_precision"], "WORLD_SIZE": "2"}
    line = _refused(tmp_path, capsys, monkeypatch, env, [])
    assert "mixed_precision: bf16" in line and "--bf16 false" in line


def test_processes_that_cannot_see_each_other_are_refused(tmp_path, capsys, monkeypatch):
    # what each rank of `accelerate launch --multi_gpu --num_processes 2` without --use_cpu resolves to here:
    # WORLD_SIZE=2, yet no GPU and no CPU backend, so a process group of one
    line = _refused(tmp_path, capsys, monkeypatch, {"WORLD_SIZE": "2"}, [])
    assert "launched as 2 processes" in line and "joined no process group" in line and "--use_cpu true" in line


def test_fsdp_on_cpu_processes_is_refused_not_run_as_ddp(tmp_path, capsys, monkeypatch):
    # in one process (a world of one: a second would need the group); the MULTI_CPU case of two processes is
    # test_launch_checks.py::test_fsdp_is_refused_where_accelerate_would_drop_it[MULTI_CPU]
    config = yaml.safe_load((CONFIGS / "fsdp2.yaml").read_text())
    assert config["distributed_type"] == "FSDP"
    line = _refused(tmp_path, capsys, monkeypatch, {"ACCELERATE_USE_FSDP": "true"}, ["--use_cpu", "true"])
    assert "FSDP was requested" in line and "plain DDP" in line and "deepspeed_zero3_cpu.yaml" in line
