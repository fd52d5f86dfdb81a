"""Every benchmark's cheapest path, once (``--quick``, smallest sizes, one repetition): its JSON, and what its
numbers must satisfy whatever the machine: counts against an independent count, derived numbers recomputed from
the measured ones, the variants agreeing on what they compute.

No timing assertions (timings are what the benchmarks measure, on whatever machine runs them).
"""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from helpers.bench import importable_benchmarks

BENCH = importable_benchmarks()

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]


@pytest.fixture(autouse=True)
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def memory_ratio_ok(x) -> bool:
    """An in-process peak-memory ratio of tiny smoke steps: either step may allocate nothing above its
    start (a real 0 MiB delta), so 0 (0/y) and infinity (x/0) are honest values; NaN or a
    negative number is not."""
    return isinstance(x, (int, float)) and not math.isnan(x) and x >= 0


def positive_finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def last_json_line(capsys) -> dict:
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    return json.loads(lines[-1])


def test_echo_overhead(capsys, tmp_path):
    import echo_overhead

    out = echo_overhead.main(
        [
            "--quick",
            "--json",
            "--repeats",
            "1",
            "--hidden_size",
            "32",
            "--num_layers",
            "1",
            "--max_completion_length",
            "32",
            "--no_tool_schemas",
            "--output",
            str(tmp_path / "r.json"),
        ]
    )
    assert last_json_line(capsys) == json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(out))
    assert positive_finite(out["time_ratio"]) and memory_ratio_ok(out["memory_ratio"])
    assert all(math.isfinite(mb) and mb >= 0 for mb in out["median_peak_mb"].values())
    # one repetition: its paired ratio is the headline, and the ratio of the medians is the same two numbers
    assert out["repeats"] == 1 and out["time_ratio_per_repetition"] == [out["time_ratio"]]
    seconds = out["median_step_seconds"]
    assert set(seconds) == {"echo (lambda=0.05)", "grpo (lambda=0)"}
    assert out["time_ratio_of_medians"] == pytest.approx(
        seconds["echo (lambda=0.05)"] / seconds["grpo (lambda=0)"], rel=1e-2
    )
    assert out["tokens_per_step"] > 0 and out["batch_rows"] == 2


def test_vs_sft(capsys):
    import vs_sft

    out = vs_sft.main(
        [
            "--quick",
            "--json",
            "--repeats",
            "1",
            "--hidden_size",
            "32",
            "--num_layers",
            "1",
            "--max_completion_length",
            "32",
            "--no_tool_schemas",
        ]
    )
    assert last_json_line(capsys)["benchmark"] == "vs_sft"
    assert positive_finite(out["time_ratio"]) and memory_ratio_ok(out["memory_ratio"])
    assert all(math.isfinite(mb) and mb >= 0 for mb in out["median_peak_mb"].values())
    seconds = out["median_step_seconds"]
    assert set(seconds) == {"echo (lambda=0.05)", "sft"}
    assert out["repeats"] == 1 and out["time_ratio_per_repetition"] == [out["time_ratio"]]
    assert out["time_ratio_of_medians"] == pytest.approx(seconds["echo (lambda=0.05)"] / seconds["sft"], rel=1e-2)
    assert out["batch_rows"] == 2 and out["tokens_first_batch"] > 0


def test_vs_full_logits():
    """In a subprocess: the script re-execs with a pinned glibc mmap threshold, so freed memory leaves the
    resident set (in-process, after other tests, glibc reuses freed blocks and small peaks read as 0)."""
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "step" / "vs_full_logits.py"),
            "--quick",
            "--json",
            "--lengths",
            "128",
            "256",
            "--vocab_size",
            "32768",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "vs_full_logits" and out["at_length"] == 256
    for T in ("128", "256"):
        r = out["per_length"][T]
        assert memory_ratio_ok(r["memory_ratio"]) and positive_finite(r["time_ratio"])
        assert r["loss_abs_diff"] < 1e-3  # both compute the same world loss


def test_scaling(capsys):
    import scaling

    out = scaling.main(["--quick", "--json", "--lengths", "512", "1024", "--repeats", "1"])
    assert last_json_line(capsys)["benchmark"] == "scaling"
    for key in ("time_exponent", "memory_exponent", "grpo_time_exponent"):
        assert math.isfinite(out[key])
    assert all(positive_finite(x) for x in out["echo_over_grpo_time_ratios"])
    short, long = out["per_length"]["512"], out["per_length"]["1024"]
    # each trajectory renders to just at or above the length asked for
    assert 512 <= short["tokens_per_trajectory"] < 1024 <= long["tokens_per_trajectory"] < 1.25 * 1024
    # two lengths: the fitted exponents are the slopes through the two points
    run = math.log(long["tokens_per_trajectory"] / short["tokens_per_trajectory"])
    for key, measured in (("time_exponent", "echo_seconds"), ("grpo_time_exponent", "grpo_seconds")):
        assert out[key] == pytest.approx(math.log(long[measured] / short[measured]) / run, abs=2e-3)
    assert out["echo_over_grpo_time_ratios"] == [short["echo_over_grpo_time"], long["echo_over_grpo_time"]]


def test_prefix_sharing():
    """In a subprocess (pinned glibc mmap threshold, as vs_full_logits): tiny shapes, every key, exact log-probs."""
    import subprocess

    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "step" / "prefix_sharing.py"),
            "--quick",
            "--json",
            "--groups",
            "3",
            "--preambles",
            "96",
            "--completion_range",
            "8",
            "24",
            "--hidden_size",
            "32",
            "--num_layers",
            "1",
            "--vocab_size",
            "256",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    r = out["per_shape"]["G3_P96"]
    assert out["benchmark"] == "prefix_sharing" and set(r["seconds"]) == {"unshared", "packed", "shared"}
    assert positive_finite(r["speedup_vs_unshared"]) and positive_finite(r["speedup_vs_packed"])
    assert r["forwarded_tokens_shared"] < r["row_tokens"] <= r["padded_tokens"]
    assert r["max_abs_logp_diff"] < 1e-5  # all three variants compute the same log-probs


def test_long_episodes(capsys):
    """Stats of two short synthetic episodes (no training child): every key, token counts that grow with steps."""
    import long_episodes

    long_episodes.main(["--quick", "--steps", "50", "100", "--train_tokens", "0", "--json"])
    out = last_json_line(capsys)
    rows = out["stats"]
    assert [r["steps"] for r in rows] == [50, 100] and rows[0]["tokens"] < rows[1]["tokens"]
    assert all(positive_finite(r["stats_s"]) and positive_finite(r["render_s"]) for r in rows)
    assert math.isfinite(out["stats_exponent"]) and math.isfinite(out["render_exponent"])


def test_behavior_policy(capsys):
    import behavior_policy

    episodes, batch = 4, 2
    out = behavior_policy.main(
        ["--quick", "--json", "--episodes", str(episodes), "--batch_size", str(batch)]
        + ["--hidden_size", "32", "--num_layers", "1"]
    )
    assert last_json_line(capsys)["benchmark"] == "behavior_policy"
    assert out["episodes"] == episodes and out["repeats"] == 1
    # the whole-dataset pass: one no-grad forward per micro-batch of an epoch, i.e. per trajectory once; the lazy
    # path forwards the same number of micro-batches over the first epoch, and none once they are stored
    assert out["no_grad_forwards_of_the_pass"] == out["micro_batches_per_epoch"] == math.ceil(episodes / batch)
    assert out["starting_forwards_cold_epoch"] == out["micro_batches_per_epoch"]
    assert out["starting_forwards_stored_epoch"] == 0 and out["frozen_copy_mb"] > 0
    assert all(positive_finite(v) for v in out["median_seconds"].values())
    assert positive_finite(out["pass_over_epoch"]) and positive_finite(out["epoch_ratio_initial_over_current"])


def test_scale_episodes_are_distinct_valid_and_sixty_per_scenario(tmp_path):
    import scale_episodes

    from echo_trl.data.build import build_awm_dataset

    written = scale_episodes.write_episodes(130, tmp_path / "eps", per_file=50)
    assert written == sum(f.stat().st_size for f in (tmp_path / "eps").glob("*.jsonl"))
    assert len(list((tmp_path / "eps").glob("*.jsonl"))) == 3
    ds = build_awm_dataset([tmp_path / "eps"])  # strict: every generated episode is valid
    assert len(ds) == 130 and len(set(ds["scenario"])) == 3
    assert sorted(ds["scenario"]).count("library_1_r0") == 60
    texts = {json.dumps([row["prompt"], row["completion"]]) for row in ds}
    assert len(texts) == 130  # no two episodes alike


def test_scale_linear_fit():
    import scale

    a, b = scale.linear_fit([1000, 10000, 100000], [2.0 + 0.003 * x for x in (1000, 10000, 100000)])
    assert math.isclose(a, 2.0) and math.isclose(b, 0.003)


@pytest.mark.slow
@pytest.mark.sandbox
def test_online_step(capsys):
    """One G = 2 online step each way on the bundled scenario (servers, tool loop, verifier): every key, real tool
    calls, the shared forward running the micro-batch's unique tokens (an independent trie count) and the unshared
    one its padded rows, the same loss both ways."""
    import online_step

    out = online_step.main(
        ["--quick", "--json", "--hidden_size", "32", "--num_layers", "1", "--max_completion_length", "256"]
    )
    assert last_json_line(capsys)["benchmark"] == "online_step"
    shared, unshared = out["runs"]["G2_shared"], out["runs"]["G2_unshared"]
    for r in (shared, unshared):
        assert r["tool_calls_per_rollout"] > 0 and r["world_tokens"] > 0
        assert all(positive_finite(r[unit]["step"]) for unit in ("wall", "cpu"))
        assert 0 <= r["environment_share"] <= 1
    assert unshared["run_tokens"] == unshared["tokens"]["padded"]
    assert abs(shared["run_tokens"] - shared["tokens"]["unique"]) <= 2  # a branch costs one duplicated token
    assert shared["packing_ratio"] > 1.5 > unshared["packing_ratio"]  # two rows sharing a ~3.4k-token prompt
    assert shared["loss_gap_vs_unshared"] < 1e-5
    assert positive_finite(out["G2_step_ratio"]) and positive_finite(out["G2_cpu_step_ratio"])


def test_sft_step(capsys):
    import sft_step

    out = sft_step.main(
        ["--quick", "--json", "--repeats", "1", "--hidden_size", "32", "--num_layers", "1", "--max_length", "256"]
    )
    assert last_json_line(capsys)["benchmark"] == "sft_step"
    assert positive_finite(out["time_ratio"]) and memory_ratio_ok(out["memory_ratio"])
    assert set(out["median_step_seconds"]) == {"EchoSFTTrainer", "SFTTrainer"}
    assert out["rows_with_role_weights"] != "0/8"  # the timed Echo steps do carry role weights
