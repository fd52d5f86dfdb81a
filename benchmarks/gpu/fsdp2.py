"""FSDP2 against one process on GPUs: the logged losses of the same global batch, and their difference.

GPU-only (accelerate keeps FSDP only for GPU-type processes; `echo-trl train` refuses the FSDP config on CPU)
and two GPUs at least for the sharded comparison (NCCL does not put two ranks on one device);
``--num_processes 1`` runs FSDP2 as one rank on one GPU (the wrapping, mixed-precision policy and sharded
state on a world of one: the same losses as the plain process, and the wall-time cost of the FSDP path).
Builds a tiny local model and the synthetic AWM-style dataset (no downloads), then runs, on the same 8
trajectories and settings:

* ``accelerate launch --config_file examples/accelerate_configs/fsdp2.yaml --num_processes N`` (float32,
  ``--mixed_precision no``; N = 2 by default), ``--per_device_train_batch_size 8 / N``,
  with ``behavior_policy="initial"`` (the starting-model log-probs computed inside the sharded model at the
  first batch);
* one process, ``--per_device_train_batch_size 8``;

and prints each step's loss in both and the largest absolute difference (expected: float noise, below 1e-5).

    python benchmarks/gpu/fsdp2.py [--quick] [--steps 3] [--num_processes 2] [--json]      # --quick: one step
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def assets(root: Path) -> tuple[Path, Path]:
    from echo_trl.data.build import build_awm_dataset
    from echo_trl.data.store import save_dataset
    from echo_trl.demo.episodes import synthetic_episodes, write_episodes
    from echo_trl.demo.tiny import ensure_tiny_model

    ds = build_awm_dataset([write_episodes(synthetic_episodes(n_tasks=2, per_task=4, seed=1), root / "eps.jsonl")])
    save_dataset(ds, root / "data")
    corpus = [m["content"] for row in ds for m in row["completion"]]
    model = ensure_tiny_model(root / "model", family="qwen3", corpus=corpus, vocab_size=600, hidden_size=64)
    return Path(model), root / "data"


def train(cmd: list[str], root: Path, out: Path, model: Path, data: Path, per_device: int, steps: int) -> float:
    flags = [
        *("train", "--model_name_or_path", str(model), "--dataset_name", str(data), "--output_dir", str(out)),
        *("--max_steps", str(steps), "--per_device_train_batch_size", str(per_device), "--num_generations", "2"),
        *("--bf16", "false", "--dtype", "float32", "--report_to", "none", "--save_strategy", "no"),
        *("--logging_steps", "1", "--max_completion_length", "1024", "--gradient_checkpointing", "false"),
        *("--learning_rate", "1e-2", "--world_model_coeff", "0.05", "--seed", "0", "--disable_tqdm", "true"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    start = time.monotonic()
    proc = subprocess.run([*cmd, *flags], env=env, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"fsdp2 benchmark: {' '.join(cmd[:6])} ... failed:\n{proc.stderr[-4000:]}")
    return time.monotonic() - start


def losses(out: Path) -> list[float]:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return [h["loss"] for h in history if "loss" in h]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 3; --quick 1)")
    p.add_argument("--quick", action="store_true", help="the smallest run: one step")
    p.add_argument("--num_processes", type=int, default=2, choices=[1, 2, 4, 8], help="FSDP ranks, one GPU each")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    n = args.num_processes
    args.steps = args.steps or (1 if args.quick else 3)
    import torch

    if torch.cuda.device_count() < n:
        sys.exit(f"fsdp2 benchmark: needs {n} GPUs (found {torch.cuda.device_count()}); FSDP runs only on GPUs")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, data = assets(root)
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
        launch += [str(REPO / "examples/accelerate_configs/fsdp2.yaml"), "--num_processes", str(n)]
        launch += ["--mixed_precision", "no", "-m", "echo_trl.commands.cli"]
        walls = {
            "fsdp2": train(launch, root, root / "fsdp2", model, data, 8 // n, args.steps),
            "single": train(
                [sys.executable, "-m", "echo_trl.commands.cli"], root, root / "one", model, data, 8, args.steps
            ),
        }
        sharded, single = losses(root / "fsdp2"), losses(root / "one")
    diff = max(abs(a - b) for a, b in zip(sharded, single, strict=True))
    result = {"num_processes": n, "fsdp2_loss": sharded, "single_loss": single, "max_abs_diff": diff, "wall_s": walls}
    if args.json:
        print(json.dumps(result))
        return
    for step, (a, b) in enumerate(zip(sharded, single, strict=True), start=1):
        print(f"step {step}: fsdp2 {a:.8f}  single {b:.8f}  |diff| {abs(a - b):.2e}")
    print(f"max |loss difference| FSDP2 ({n} processes) vs one process: {diff:.2e}")


if __name__ == "__main__":
    main()
