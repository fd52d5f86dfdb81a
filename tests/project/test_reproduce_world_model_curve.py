"""examples/reproduce_world_model_curve.py: the collapse flag, and a tiny end-to-end run whose summary
numbers are recomputed from its own held-out curves."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "reproduce_world_model_curve.py"


@pytest.fixture(scope="module")
def curve():
    spec = importlib.util.spec_from_file_location("reproduce_world_model_curve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_summary(coeff: float, action_tail: float, entropy: float | None = 2.0) -> dict:
    return {"world_model_coeff": coeff, "heldout_ce_action_tail": action_tail, "final_entropy": entropy}


def test_collapse_flag_uses_the_tail_mean_and_the_paper_threshold(curve):
    sweep = {
        "0": run_summary(0.0, 2.0),
        "0.02": run_summary(0.02, 2.19),
        "0.05": run_summary(0.05, 2.21),
        "0.1": run_summary(0.1, 2.0, entropy=0.9),
        "0.2": run_summary(0.2, 1.5),
    }
    curve.flag_collapse(sweep, tol=0.10)
    flags = {k: r["collapse_flag"] for k, r in sweep.items()}
    assert flags == {"0": False, "0.02": False, "0.05": True, "0.1": True, "0.2": True}
    assert "action CE" in sweep["0.05"]["collapse_reasons"][0]
    assert sweep["0.1"]["collapse_reasons"] == ["policy entropy < half of lambda=0's"]
    assert sweep["0.2"]["collapse_reasons"] == ["lambda > 0.1 (paper: collapse at 0.2)"]


@pytest.mark.slow
def test_tiny_run_writes_results_consistent_with_its_curves(curve, tmp_path):
    out = tmp_path / "curve"
    results = curve.main(
        [
            "--output_dir",
            str(out),
            "--max_steps",
            "4",
            "--eval_every",
            "2",
            "--warmup_steps",
            "2",
            "--hidden_size",
            "32",
            "--sweep",
            "0",
            "0.05",
            "--per_device_train_batch_size",
            "4",
        ]
    )
    assert json.loads((out / "results.json").read_text())["acceptance"] == results["acceptance"]
    assert set(results["runs"]) == {"echo", "grpo", "verifier_free"}
    for r in results["runs"].values():
        steps = [c["step"] for c in r["eval_curve"]]
        assert steps == [0, 2, 4]
        env = [c["heldout_ce_env"] for c in r["eval_curve"]]
        assert all(math.isfinite(x) and x > 0 for x in env)
        assert r["heldout_ce_env_rel_change"] == pytest.approx((env[-1] - env[0]) / env[0])
        tail = [c["heldout_ce_action"] for c in r["eval_curve"] if c["step"] >= 3]
        assert r["heldout_ce_action_tail"] == pytest.approx(sum(tail) / len(tail))
    # every run starts from the same model: the same step-0 evaluation
    assert len({r["eval_curve"][0]["heldout_ce_env"] for r in results["runs"].values()}) == 1
    # lambda = 0 never sees the world term; the verifier-free run sees only it
    assert all(s["world_loss_scaled"] == 0.0 for s in results["runs"]["grpo"]["train_log"])
    assert all(s["policy_loss"] is None for s in results["runs"]["verifier_free"]["train_log"])
    acc = results["acceptance"]
    assert acc["met"] == (acc["echo_rel_change"] <= -0.30 and abs(acc["grpo_rel_change"]) < 0.05)
    if results["plots"]:
        assert all(Path(p).stat().st_size > 0 for p in results["plots"])
