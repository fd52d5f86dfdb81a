"""Shared benchmark plumbing: flags, A/B timing with medians, a table and one JSON line."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes: a CPU run of at most ~2 minutes")
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object with the results")
    p.add_argument("--output", type=Path, default=None, help="also write the JSON results to this file")
    return p


def step_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the benchmarks that time a trainer step on a tiny model: threads, repetitions, rows per step and
    the model's size (each ``None``: the benchmark's own default, smaller with ``--quick``)."""
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--batch_size", type=int, default=None)
    p.add_argument("--hidden_size", type=int, default=None)
    p.add_argument("--num_layers", type=int, default=None)


def setup(args) -> None:
    """Quiet logs and pin torch's CPU threads (``--threads``, default 1: on a shared or small machine OpenMP
    threads that wait on each other made steps 20x slower and the A/B timings noisy)."""
    import torch

    quiet()
    threads = getattr(args, "threads", None)
    if not torch.cuda.is_available() or threads:
        torch.set_num_threads(threads or 1)


def alternate(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Run each variant ``repeats`` times, interleaved (A B A B ...), so drift hits both alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def report(rows: list[tuple[str, ...]], header: tuple[str, ...], results: dict, args) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)))
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))
    if args.json:
        print(json.dumps(results))


# --------------------------------------------------------------------------------------------
# Peak memory on CPU (and CUDA when present), and A/B runs that record time and memory together

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def ensure_malloc_env() -> None:
    """Re-exec once with a fixed glibc mmap threshold, so freed tensors go back to the OS at once.

    Without it glibc keeps freed blocks (its mmap threshold grows after every large free) and a later
    allocation reuses them without raising the resident set: peak-RSS deltas would read too low.
    Call it first thing in ``__main__`` (never in-process from tests).
    """
    import os
    import sys

    if all(os.environ.get(k) == v for k, v in MALLOC_ENV.items()):
        return
    os.environ.update(MALLOC_ENV)
    os.execv(sys.executable, [sys.executable, *sys.argv])


def status_mb(key: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in MiB; NaN where the kernel has none."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def memory_method() -> str:
    import torch

    if torch.cuda.is_available():
        return "torch.cuda.max_memory_allocated delta"
    return "peak RSS delta (Linux VmHWM reset via /proc/self/clear_refs), glibc mmap threshold pinned"


def ratio(x: float, y: float) -> float:
    """``x / y`` for measured amounts that may both be 0 (a step that allocated nothing above its start):
    equal amounts are a ratio of 1; something against nothing is infinite (and says so in the JSON)."""
    if y == 0:
        return 1.0 if x == 0 else float("inf")
    return x / y


def measure_call(fn: Callable[[], object]) -> tuple[float, float]:
    """``(seconds, peak memory above the level at the call, MiB)`` of one ``fn()``.

    CUDA: the allocator's peak. CPU: the kernel's resident-set high-water mark, reset just before
    the call (``/proc/self/clear_refs`` = 5), minus the resident set at that moment: everything the
    call allocates (torch tensors, Python objects) counts, freed memory is not double counted.
    """
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        return dt, (torch.cuda.max_memory_allocated() - base) / 2**20
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass
    base = status_mb("VmRSS")
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    # The kernel's RSS counters are approximate (per-CPU batched) and its high-water mark is refreshed lazily,
    # so for a call that allocates next to nothing the difference can read a few MiB below 0: a peak above the
    # starting level is never negative, so that is read as 0.
    return dt, max(0.0, status_mb("VmHWM") - base)


def alternate_measured(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, dict[str, list[float]]]:
    """Like :func:`alternate` (A B A B ...), recording each call's time and peak memory delta."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out = {k: {"seconds": [], "peak_mb": []} for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            dt, mb = measure_call(fn)
            out[name]["seconds"].append(dt)
            out[name]["peak_mb"].append(mb)
    return out


def paired_over_batches(
    steps: dict[str, Callable[[slice], object]], n_rows: int, batch: int, repeats: int
) -> tuple[dict[str, dict[str, float]], list[float], list[float]]:
    """Two variants' steps (name -> step on a slice of the rows) on the same batch, one warm-up each, then
    ``repeats`` pairs, the order flipped every repetition and the batch moving on after each: the medians per
    variant (``seconds``, ``peak_mb``) and the paired time and memory ratios (first variant over second)."""
    starts = list(range(0, n_rows - batch + 1, batch))
    at = {"i": 0}
    fns = {
        k: (lambda step=step: step(slice(starts[at["i"] % len(starts)], starts[at["i"] % len(starts)] + batch)))
        for k, step in steps.items()
    }
    names = list(fns)
    results = {k: {"seconds": [], "peak_mb": []} for k in names}
    alternate_measured(fns, 0, warmup=1)
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        rep = alternate_measured({k: fns[k] for k in order}, 1, warmup=0)
        for k in order:
            results[k]["seconds"] += rep[k]["seconds"]
            results[k]["peak_mb"] += rep[k]["peak_mb"]
        at["i"] += 1
    first, second = (results[k] for k in names)
    ratios = [x / y for x, y in zip(first["seconds"], second["seconds"], strict=True)]
    mem_ratios = [ratio(x, y) for x, y in zip(first["peak_mb"], second["peak_mb"], strict=True)]
    med = {k: {"seconds": median(v["seconds"]), "peak_mb": median(v["peak_mb"])} for k, v in results.items()}
    return med, ratios, mem_ratios


def quiet() -> None:
    """Silence progress bars and deprecation chatter (benchmarks print one table)."""
    from echo_trl.progress import quiet_libraries

    quiet_libraries()


def bundled_dataset(compact_tools: bool = True):
    """The 60 captured ``library_1`` episodes as a trajectory dataset (AWM-length trajectories)."""
    from echo_trl.data.build import build_awm_dataset

    return build_awm_dataset([REPO / "data" / "episodes"], compact_tools=compact_tools)


def corpus_of(ds) -> list[str]:
    """Message texts and tool-call arguments of a trajectory dataset (to train a tiny tokenizer on)."""
    from echo_trl.demo.tiny import corpus_of as texts

    return list(texts(ds))


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) on log(x): y ~ x ** slope."""
    import math

    lx = [math.log(x) for x in xs]
    ly = [math.log(max(y, 1e-12)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((a - mx) ** 2 for a in lx)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / den if den else float("nan")


def echo_trainer(model, tokenizer, train_dataset, output_dir: str, **overrides):
    """An offline ``EchoGRPOTrainer`` ready for hand-driven steps (``step(trainer, rows)``)."""
    from echo_trl.config import EchoGRPOConfig
    from echo_trl.trainer import EchoGRPOTrainer

    kw = dict(
        output_dir=output_dir,
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=10_000,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        max_completion_length=None,
        gradient_checkpointing=False,
        learning_rate=1e-5,
        disable_tqdm=True,
        lr_scheduler_type="constant",
        warmup_steps=0,
        seed=0,
    )
    kw.update(overrides)
    trainer = EchoGRPOTrainer(
        model, args=EchoGRPOConfig(**kw), train_dataset=train_dataset, processing_class=tokenizer
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer.create_optimizer()
    return trainer


def echo_step(trainer, rows) -> float:
    """One offline optimizer step as ``Trainer.train`` runs it: collate, forward, backward, AdamW, zero grad."""
    loss = trainer.training_step(trainer.model, rows, None)
    trainer.optimizer.step()
    trainer.model.zero_grad(set_to_none=True)
    trainer.state.global_step += 1
    return float(loss)
