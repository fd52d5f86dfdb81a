"""`echo-trl train` under DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU processes (gloo), against one process.

Launched with the shipped CPU config (``examples/accelerate_configs/deepspeed_zero3_cpu.yaml``; ZeRO-2 with
``--zero_stage 2`` on the launch line) and ``--ddp_backend gloo``, as docs/training.md says. Two launches,
each checking several things against a one-process run on the same global batch:

* ZeRO-3, ``behavior_policy="initial"`` (the default), prefix sharing on, full fine-tuning: the weights are
  really partitioned (each process holds about half), the starting-model log-probs computed inside the
  prepared model at the first batch equal the one-process values (computed at trainer init) within 1e-5,
  and the logged losses (step 2 uses them in the importance ratio) equal the one-process losses within 1e-5;
* ZeRO-2, LoRA, ``behavior_policy="current"``, prefix sharing off: the engine runs ZeRO stage 2, the logged
  losses equal one process's within 1e-5 and the trained adapter matches.

A third ZeRO-3 launch resumes the first from its step-1 checkpoint: no starting-model log-probs are computed
(the checkpoint carries them) and step 2 logs the uninterrupted run's loss.

Every launch also ends cleanly: it returns within its timeout (a hang at exit shows as the timeout), and each
rank destroyed its process group on the way out (the teardown every exit path of ``echo-trl train`` takes).

CI budget: 5 launches (3 x 2 processes, 2 x 1); measured times in docs/training.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.launch import CONFIGS, accelerate_launch, launch_env, loss_logs, run, single_process, write_probe

from echo_trl.data.build import build_awm_dataset
from echo_trl.data.store import save_dataset
from echo_trl.demo.episodes import synthetic_episodes, write_episodes

pytest.importorskip("deepspeed", reason="deepspeed is in the dev extra: pip install -e '.[dev]'")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")]

STEPS = 2
TOL = 1e-5
CASES = {
    "zero3_initial_shared": (["--zero_stage", "3"], ["--behavior_policy", "initial", "--prefix_sharing", "true"]),
    "zero2_lora_current": (
        ["--zero_stage", "2"],
        ["--behavior_policy", "current", "--prefix_sharing", "false", "--use_peft", "true", "--lora_r", "4"]
        + ["--lora_alpha", "8", "--lora_dropout", "0", "--lora_target_modules", "q_proj", "v_proj"],
    ),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from echo_trl.demo.tiny import ensure_tiny_model

    root = tmp_path_factory.mktemp("deepspeed")
    ds = build_awm_dataset([write_episodes(synthetic_episodes(n_tasks=2, per_task=4, seed=1), root / "eps.jsonl")])
    save_dataset(ds, root / "data")
    corpus = [m["content"] for row in ds for m in row["completion"]]
    model = ensure_tiny_model(root / "model", family="qwen3", corpus=corpus, vocab_size=600, hidden_size=32)
    return root, model, write_probe(root)


def train_flags(root: Path, model: Path, out: Path, per_device: int) -> list[str]:
    return [
        "train",
        *("--model_name_or_path", str(model), "--dataset_name", str(root / "data"), "--output_dir", str(out)),
        *("--max_steps", str(STEPS), "--per_device_train_batch_size", str(per_device), "--num_generations", "2"),
        *("--bf16", "false", "--dtype", "float32", "--report_to", "none", "--save_strategy", "no"),
        *("--logging_steps", "1", "--max_completion_length", "1024", "--gradient_checkpointing", "false"),
        *("--disable_tqdm", "true", "--learning_rate", "1e-2", "--world_model_coeff", "0.05", "--seed", "0"),
    ]


def sharded_cmd(root: Path, model: Path, out: Path, launch_args: list[str], flags: list[str]) -> list[str]:
    config = ["--config_file", str(CONFIGS / "deepspeed_zero3_cpu.yaml"), "--num_processes", "2"]
    return [
        *accelerate_launch(*config, *launch_args),
        *train_flags(root, model, out, 4),
        *flags,
        "--ddp_backend",
        "gloo",
    ]


@pytest.fixture(scope="module")
def runs(assets):
    """``runs(case)``: the case's two runs (launched on first use), by name: ``(output_dir, probe_dir)``."""
    root, model, probe = assets
    results, walls = {}, {}

    def launch(case: str) -> dict:
        launch_args, flags = CASES[case]
        for mode in ("sharded", "single"):
            name = f"{case}_{mode}"
            if name in results:
                continue
            probe_out = root / f"probe_{name}"
            probe_out.mkdir()
            out = root / name
            if mode == "sharded":
                cmd = sharded_cmd(root, model, out, launch_args, flags)
                if case == "zero3_initial_shared":  # a checkpoint after step 1, for the resume test
                    cmd += ["--save_strategy", "steps", "--save_steps", "1"]
                env = launch_env(probe, probe_out)
            else:
                cmd = [*single_process(), *train_flags(root, model, out, 8), *flags, "--use_cpu", "true"]
                env = launch_env(probe, probe_out, RANK="0")
            proc, walls[name] = run(cmd, env, root, timeout=600)  # a hang at exit shows as the timeout
            assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
            results[name] = (out, probe_out)
        print("launch wall times (s):", {k: round(v, 1) for k, v in walls.items()})
        return results

    return launch


def _left_the_group(probe_out: Path) -> None:
    """Both ranks destroyed their process group after their one training (the probe writes
    ``teardown{rank}.json`` then). DeepSpeed's engine stays referenced by the hooks it put on the model until the
    interpreter exits, so unlike DDP (tests/test_distributed.py) whether it was collected first is not asked."""
    for rank in (0, 1):
        assert len(json.loads((probe_out / f"teardown{rank}.json").read_text())["wrapped_alive"]) == 1, rank


def _losses_match(runs, case):
    sharded, single = loss_logs(runs[f"{case}_sharded"][0]), loss_logs(runs[f"{case}_single"][0])
    assert len(sharded) == len(single) == STEPS
    for a, b in zip(sharded, single, strict=True):
        for key in ("loss", "world/ce_env", "world/tokens_env"):
            assert a[key] == pytest.approx(b[key], abs=TOL, rel=0), (case, a["step"], key, a[key], b[key])
    assert sharded[0]["world/tokens_env"] > 0
    worst = max(abs(a[k] - b[k]) for a, b in zip(sharded, single, strict=True) for k in ("loss", "world/ce_env"))
    print(f"{case}: largest |sharded - one process| over the logged losses: {worst:.2e}")


def test_zero3_shards_the_weights_and_initial_equals_one_process(runs):
    case = "zero3_initial_shared"
    runs = runs(case)
    ranks = [torch.load(runs[f"{case}_sharded"][1] / f"rank{r}.pt") for r in (0, 1)]
    for r in ranks:
        assert r["world_size"] == 2 and r["zero_stage"] == 3
        assert r["held"] < 0.75 * r["full"]  # ZeRO-3 partitions: each process holds about half of the weights
    initial = [torch.load(runs[f"{case}_sharded"][1] / f"initial{r}.pt") for r in (0, 1)]
    single = torch.load(runs[f"{case}_single"][1] / "initial0.pt")
    assert all(i["step"] == 0 for i in initial)  # before the first optimizer step
    expected = single["values"]
    assert expected and all(sorted(i["values"]) == sorted(expected) for i in initial)  # every row, on both ranks
    n = 0
    for row, values in expected.items():
        for got in initial:
            torch.testing.assert_close(torch.tensor(got["values"][row]), torch.tensor(values), atol=TOL, rtol=0)
        n += len(values)
    assert n > 100
    _left_the_group(runs[f"{case}_sharded"][1])
    worst = max(
        abs(a - b) for got in initial for r, v in expected.items() for a, b in zip(got["values"][r], v, strict=True)
    )
    print(f"{case}: {n} starting-model log-probs, largest |ZeRO-3 - one process|: {worst:.2e}")
    _losses_match(runs, case)


def test_zero2_lora_current_equals_one_process(runs):
    case = "zero2_lora_current"
    runs = runs(case)
    ranks = [torch.load(runs[f"{case}_sharded"][1] / f"rank{r}.pt") for r in (0, 1)]
    single = torch.load(runs[f"{case}_single"][1] / "rank0.pt")
    assert all(r["world_size"] == 2 and r["zero_stage"] == 2 for r in ranks)
    assert not (runs[f"{case}_sharded"][1] / "initial0.pt").exists()  # "current": nothing computed
    _left_the_group(runs[f"{case}_sharded"][1])
    _losses_match(runs, case)
    params = ranks[0]["params"]
    assert params and all("lora_" in n for n in params)  # only the adapter trains
    for name, value in params.items():
        torch.testing.assert_close(value, single["params"][name], rtol=1e-3, atol=1e-4, msg=name)
        torch.testing.assert_close(value, ranks[1]["params"][name], rtol=0, atol=0, msg=name)


def test_zero3_resume_takes_the_starting_logprobs_from_the_checkpoint(assets, runs):
    """Resumed after step 1, the run computes no starting-model log-probs (they would come from trained weights):
    the checkpoint carries them, and step 2 logs the loss of the uninterrupted run."""
    root, model, probe = assets
    case = "zero3_initial_shared"
    done = runs(case)[f"{case}_sharded"][0]
    checkpoint = done / "checkpoint-1"
    assert (checkpoint / "echo_initial_logprobs.pt").is_file()
    probe_out, out = root / "probe_resumed", root / "resumed"
    probe_out.mkdir()
    launch_args, flags = CASES[case]
    cmd = [*sharded_cmd(root, model, out, launch_args, flags), "--resume_from_checkpoint", str(checkpoint)]
    proc, wall = run(cmd, launch_env(probe, probe_out), root, timeout=600)
    assert proc.returncode == 0, f"resume failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    print(f"resume launch wall time (s): {wall:.1f}")
    assert not list(probe_out.glob("initial*.pt"))  # never recomputed
    _left_the_group(probe_out)
    resumed, uninterrupted = loss_logs(out), loss_logs(done)
    assert [h["step"] for h in resumed] == [1, 2]  # step 1's entry comes with the checkpoint's trainer state
    for key in ("loss", "world/ce_env"):
        assert resumed[1][key] == pytest.approx(uninterrupted[1][key], abs=TOL, rel=0), key
    print(f"resumed step 2 loss - uninterrupted: {abs(resumed[1]['loss'] - uninterrupted[1]['loss']):.2e}")
