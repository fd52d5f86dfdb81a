"""What ``behavior_policy="initial"`` costs, and where: the starting model's log-probs, once per trajectory.

On the 60 bundled ``library_1`` episodes (full tool schemas, the AWM preamble prefix sharing forwards once per
micro-batch) and a tiny Qwen3-architecture model, it times, in alternation (medians of ``--repeats``):

* ``init current`` / ``init initial``: building the ``EchoGRPOTrainer`` (token cache warm); ``initial`` computes
  nothing at init (each row is forwarded when training first uses it) but keeps the starting model: a frozen
  copy without LoRA or a reference model (its bytes are reported);
* ``whole-dataset pass``: the option this replaced, the starting model over every trajectory before step 1
  (``echo_trl.train.offline.behavior.starting_logps``, what init used to run; its no-grad forwards are counted);
* ``epoch current`` / ``epoch initial, cold`` / ``epoch initial, stored``: one training epoch (each trajectory
  once); ``cold``: every row forwarded by the starting model on first use (an empty store), ``stored``: read from
  the store of the previous run into the same output directory (a resume, a later run).

    python benchmarks/data_scale/behavior_policy.py [--quick] [--json] [--repeats 3] [--hidden_size 64]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

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
    from echo_trl.train.offline import behavior
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

    def build(policy: str, **kw) -> EchoGRPOTrainer:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
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
        return trainer

    build("current")  # tokenize once (token cache warm for every measurement below)
    names = ("init current", "init initial", "whole-dataset pass", "epoch current", "epoch initial, cold")
    timings: dict[str, list[float]] = {k: [] for k in (*names, "epoch initial, stored")}
    pass_forwards, lazy_forwards, copy_bytes = [], [], 0
    calls: list[bool] = []  # no-grad forwards of the model a hook is on
    count = lambda *_: calls.append(torch.is_grad_enabled())  # noqa: E731
    for _ in range(args.repeats):
        for name, policy in (("init current", "current"), ("init initial", "initial")):
            t0 = time.perf_counter()
            build(policy)
            timings[name].append(time.perf_counter() - t0)
        trainer = build("initial")
        lazy = trainer._echo_starting_logps
        copy_bytes = sum(p.numel() * p.element_size() for p in lazy.source.model.parameters())
        hook = trainer.model.model.register_forward_pre_hook(count)  # the pass forwards the (untrained) model
        t0 = time.perf_counter()
        behavior.starting_logps(trainer, trainer.train_dataset, sorted(lazy.todo), lazy.settings, share=lazy.share)
        timings["whole-dataset pass"].append(time.perf_counter() - t0)
        hook.remove()
        pass_forwards.append(len(calls))
        calls.clear()
        for policy, name in (("current", "epoch current"), ("initial", "epoch initial, cold"), ("initial", "stored")):
            if name == "epoch initial, cold":
                shutil.rmtree(work / "out" / behavior.STORE_DIR, ignore_errors=True)
            trainer = build(policy)
            if policy == "initial":
                source = trainer._echo_starting_logps.source.model
                hook = source.model.register_forward_pre_hook(count)
            t0 = time.perf_counter()
            trainer.train()
            timings["epoch initial, stored" if name == "stored" else name].append(time.perf_counter() - t0)
            if policy == "initial":
                hook.remove()
                lazy_forwards.append(len(calls))
                calls.clear()
    shutil.rmtree(work, ignore_errors=True)

    med = {k: median(v) for k, v in timings.items()}
    steps = -(-len(ds) // args.batch_size)
    pass_seconds = med["whole-dataset pass"]
    results = {
        "benchmark": "behavior_policy",
        "episodes": len(ds),
        "batch_size": args.batch_size,
        "hidden_size": args.hidden_size,
        "repeats": args.repeats,
        "median_seconds": {k: round(v, 3) for k, v in med.items()},
        "starting_pass_seconds": round(pass_seconds, 3),
        "no_grad_forwards_of_the_pass": pass_forwards[-1],
        "starting_forwards_cold_epoch": lazy_forwards[-2],
        "starting_forwards_stored_epoch": lazy_forwards[-1],
        "micro_batches_per_epoch": steps,
        "frozen_copy_mb": round(copy_bytes / 1e6, 3),
        "pass_over_epoch": round(ratio(pass_seconds, med["epoch current"]), 4),
        "init_extra_seconds": round(med["init initial"] - med["init current"], 3),
        "epoch_ratio_initial_over_current": round(ratio(med["epoch initial, cold"], med["epoch current"]), 4),
        "epoch_ratio_stored_over_current": round(ratio(med["epoch initial, stored"], med["epoch current"]), 4),
    }
    rows = [(k, f"{v:.2f}") for k, v in med.items()]
    rows += [
        ("whole-dataset pass / one epoch of training", f"{results['pass_over_epoch']:.3f}"),
        ("epoch initial cold / epoch current", f"{results['epoch_ratio_initial_over_current']:.3f}"),
        ("epoch initial stored / epoch current", f"{results['epoch_ratio_stored_over_current']:.3f}"),
        ("frozen copy of the starting model (MB)", f"{results['frozen_copy_mb']:.3f}"),
    ]
    print(
        f"{len(ds)} episodes (full tool schemas), tiny Qwen3 h{args.hidden_size}, batch {args.batch_size}; "
        f"the whole-dataset pass ran {pass_forwards[-1]} no-grad forwards for {steps} micro-batches per epoch; "
        f"an epoch forwarded the starting model {lazy_forwards[-2]} times (empty store), then {lazy_forwards[-1]}"
    )
    report(rows, ("what", "seconds (median)"), results, args)
    return results


if __name__ == "__main__":
    main()
