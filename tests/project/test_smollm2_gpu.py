"""The prepared GPU benchmark (benchmarks/gpu/smollm2_gpu.py): its model is SmolLM2-135M's shape, it refuses
without a GPU in one line, and its CPU smoke path runs the three trainers and reports consistent numbers.

No timing assertions: timings are what it measures, on whatever machine runs it.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bench import importable_benchmarks

REPO = Path(__file__).resolve().parents[2]
SCRIPT = importable_benchmarks() / "gpu" / "smollm2_gpu.py"


def test_model_shape_is_smollm2_135m():
    """134.5M parameters: the count a real SmolLM2-135M-Instruct loads with (issue #37, from its GGUF)."""
    import smollm2_gpu
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(smollm2_gpu.smollm2_config(smollm2_gpu.SMOLLM2_SHAPE))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == 134.5
    assert model.config.num_hidden_layers == 30 and model.config.num_key_value_heads == 3


def run(*args: str, cuda: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if cuda is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=REPO)


@pytest.mark.slow
def test_refuses_in_one_line_without_a_gpu():
    proc = run(cuda="")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--cpu_smoke" in lines[0]


@pytest.mark.slow
def test_cpu_smoke_reports_three_trainers_consistently():
    proc = run("--cpu_smoke", "--json", cuda="")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    variants = {"echo", "grpo", "echo_shared"}
    assert out["cpu_smoke"] and out["device"] == "cpu" and set(out["seconds"]) == variants
    assert out["tokens_per_step"] > 0
    for name in variants:
        seconds = out["per_repetition_seconds"][name]
        assert len(seconds) == out["repeats"] and all(math.isfinite(s) and s > 0 for s in seconds)
        # seconds is the median step time, tokens/s the step's token count over it (both from the unrounded times)
        step = statistics.median(seconds)
        assert out["seconds"][name] == pytest.approx(step, abs=1e-4)
        assert out["tokens_per_s"][name] == pytest.approx(out["tokens_per_step"] / step, abs=0.06)
    # the ratios are the medians of the per-repetition pairs
    reps = out["per_repetition_seconds"]
    pairs = sorted(a / b for a, b in zip(reps["echo"], reps["grpo"], strict=True))
    assert out["echo_over_grpo"] == pytest.approx(pairs[len(pairs) // 2], abs=1e-4)
    assert out["fsdp2"] == {"skipped": "needs a CUDA device"}
