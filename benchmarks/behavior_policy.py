"""What ``behavior_policy="initial"`` costs: one no-gradient forward of the starting model per trajectory per run.

On the 60 bundled ``library_1`` episodes (full tool schemas, the AWM preamble prefix sharing forwards once per
micro-batch) and a tiny Qwen3-architecture model, it times, in alternation (medians of ``--repeats``):

* ``init current``: building the ``EchoGRPOTrainer`` with ``behavior_policy="current"`` (token cache warm);
* ``init initial, cold``: the same with ``"initial"`` and no cached starting-model log-probs: the extra
  seconds are the starting model's pass over every trajectory (its no-grad forwards are counted);
* ``init initial, cached``: again, the column loaded from the ``datasets`` cache (a later run, a resume);
* ``epoch current`` / ``epoch initial``: one training epoch (each trajectory once) with each setting, to put the
  one-time pass next to the training it serves and to show that no step pays anything more.

    python benchmarks/behavior_policy.py [--quick] [--json] [--repeats 3] [--hidden_size 64]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import bundled_dataset, corpus_of, median, parser, ratio, report, setup  # noqa: E402


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="alternations (default 3, quick 1)")
    p.add_argument("--hidden_size", type=int, default=64)
    p.add_argument("--num_layers", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=4, help="per_device_train_batch_size (a GRPO group of 4)")
    p.add_argument("--episodes", type=int, default=None, help="first N episodes (default all 60, quick 16)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    setup(args)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from echo_trl.config import EchoGRPOConfig
    from echo_trl.demo.tiny import ensure_tiny_model
    from echo_trl.trainer import EchoGRPOTrainer

    ds = bundled_dataset(compact_tools=False)
    n = args.episodes or (16 if args.quick else len(ds))
    ds = ds.select(range(min(n, len(ds))))
    work = Path(tempfile.mkdtemp(prefix="echo-behavior-bench-"))
    cache = work / "cache"
    os.environ["ECHO_TRL_CACHE"] = str(cache)
    model_dir = ensure_tiny_model(
        work / "tiny", family="qwen3", corpus=corpus_of(ds), hidden_size=args.hidden_size, num_layers=args.num_layers
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    forwards: list[int] = []

    def build(policy: str, *, cold: bool = False, **kw) -> EchoGRPOTrainer:
        if cold:
            for f in cache.rglob("echo-initial-logps-*.arrow"):
                f.unlink()
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        calls: list[bool] = []
        hook = model.model.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
        config = EchoGRPOConfig(
            output_dir=str(work / "out"),
            behavior_policy=policy,
            per_device_train_batch_size=args.batch_size,
            num_generations=2,
            num_train_epochs=1,
            use_cpu=True,
            bf16=False,
            report_to="none",
            logging_steps=1,
            save_strategy="no",
            gradient_checkpointing=False,
            learning_rate=1e-3,
            disable_tqdm=True,
            seed=0,
            **kw,
        )
        trainer = EchoGRPOTrainer(model, args=config, train_dataset=ds, processing_class=tokenizer)
        trainer.remove_callback(PrinterCallback)
        hook.remove()
        forwards.append(sum(not g for g in calls))
        return trainer

    build("current")  # tokenize once (token cache warm for every measurement below)
    timings: dict[str, list[float]] = {
        k: [] for k in ("init current", "init initial, cold", "init initial, cached", "epoch current", "epoch initial")
    }
    cold_forwards = []
    for _ in range(args.repeats):
        for name, policy, cold in (
            ("init current", "current", False),
            ("init initial, cold", "initial", True),
            ("init initial, cached", "initial", False),
        ):
            t0 = time.perf_counter()
            build(policy, cold=cold)
            timings[name].append(time.perf_counter() - t0)
            if cold:
                cold_forwards.append(forwards[-1])
        for policy in ("current", "initial"):
            trainer = build(policy)
            t0 = time.perf_counter()
            trainer.train()
            timings[f"epoch {policy}"].append(time.perf_counter() - t0)
    shutil.rmtree(work, ignore_errors=True)

    med = {k: median(v) for k, v in timings.items()}
    pass_seconds = med["init initial, cold"] - med["init current"]
    steps = -(-len(ds) // args.batch_size)
    results = {
        "benchmark": "behavior_policy",
        "episodes": len(ds),
        "batch_size": args.batch_size,
        "hidden_size": args.hidden_size,
        "repeats": args.repeats,
        "median_seconds": {k: round(v, 3) for k, v in med.items()},
        "starting_pass_seconds": round(pass_seconds, 3),
        "no_grad_forwards_of_the_pass": cold_forwards[-1],
        "micro_batches_per_epoch": steps,
        "pass_over_epoch": round(ratio(pass_seconds, med["epoch current"]), 4),
        "cached_extra_seconds": round(med["init initial, cached"] - med["init current"], 3),
        "epoch_ratio_initial_over_current": round(ratio(med["epoch initial"], med["epoch current"]), 4),
    }
    rows = [(k, f"{v:.2f}") for k, v in med.items()]
    rows += [
        ("starting-model pass (cold - current)", f"{pass_seconds:.2f}"),
        ("pass / one epoch of training", f"{results['pass_over_epoch']:.3f}"),
        ("epoch initial / epoch current", f"{results['epoch_ratio_initial_over_current']:.3f}"),
    ]
    print(
        f"{len(ds)} episodes (full tool schemas), tiny Qwen3 h{args.hidden_size}, batch {args.batch_size}; "
        f"the pass ran {cold_forwards[-1]} no-grad forwards for {steps} micro-batches per epoch"
    )
    report(rows, ("what", "seconds (median)"), results, args)
    return results


if __name__ == "__main__":
    main()
