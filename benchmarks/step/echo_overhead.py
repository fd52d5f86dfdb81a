"""ECHO's cost: EchoGRPOTrainer step time and peak memory with lambda = 0.05 vs lambda = 0, same batches.

Offline mode on AWM-length trajectories: the 48 captured training episodes of ``library_1``
(``data/episodes``, tasks 0-7, ~6k tokens each with compact tool schemas). Two trainers hold
identical copies of one tiny random-init Qwen3-architecture model; each repetition runs the same
rows through both, alternating which goes first, and a step is what ``Trainer.train`` does per
optimizer step: collate (tokenize + masks), forward, backward, AdamW update, zero grad.

A tiny model is the *strict* setting: the world term's cost (a masked mean over log-probs the
GRPO forward already computed) is fixed per token, so a bigger model only dilutes it.

Memory is the peak above the level at the start of the step: on CPU the resident-set high-water
mark (reset through ``/proc/self/clear_refs``; tracemalloc cannot see torch), on CUDA the
allocator's peak.

    python benchmarks/step/echo_overhead.py [--quick] [--json]
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

from common import (  # noqa: E402
    alternate_measured,
    bundled_dataset,
    corpus_of,
    echo_step,
    echo_trainer,
    ensure_malloc_env,
    median,
    memory_method,
    parser,
    ratio,
    report,
    setup,
    step_flags,
)

TIME_GOAL, MEMORY_GOAL = 1.02, 1.01


def run(args) -> dict:
    setup(args)
    import torch

    from echo_trl.demo.tiny import build_tiny_model, build_tiny_tokenizer
    from echo_trl.train import trl_compat

    torch.manual_seed(0)
    quick = args.quick
    hidden, layers = (args.hidden_size or (64 if quick else 128)), (args.num_layers or 2)
    batch = args.batch_size or 2
    repeats = args.repeats or (5 if quick else 9)
    ds = bundled_dataset()
    if args.no_tool_schemas:
        ds = ds.map(lambda r: {"tools": []})
    train = ds.filter(lambda r: r["task_idx"] < 8)
    tokenizer = build_tiny_tokenizer("qwen3", corpus_of(ds), vocab_size=2048)
    model = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=4)
    max_completion = args.max_completion_length
    tmp = tempfile.mkdtemp(prefix="echo_overhead_")
    # TRL wants the generation batch to be a multiple of num_generations (>= 2); offline, groups come from group_id
    common = dict(per_device_train_batch_size=batch, num_generations=2, max_completion_length=max_completion)
    trainers = {
        "echo (lambda=0.05)": echo_trainer(
            copy.deepcopy(model), tokenizer, train, tmp + "/echo", world_model_coeff=0.05, **common
        ),
        "grpo (lambda=0)": echo_trainer(
            copy.deepcopy(model), tokenizer, train, tmp + "/grpo", world_model_coeff=0.0, **common
        ),
    }
    rows_all = list(next(iter(trainers.values())).train_dataset)
    n = batch
    batches = [rows_all[i : i + n] for i in range(0, len(rows_all) - n + 1, n)]
    state = {"i": 0}

    def step_fn(trainer):
        def fn():
            rows = batches[state["i"] % len(batches)]
            echo_step(trainer, rows)

        return fn

    fns = {name: step_fn(t) for name, t in trainers.items()}
    names = list(fns)
    results = {name: {"seconds": [], "peak_mb": []} for name in names}
    alternate_measured(fns, 0, warmup=1)  # optimizer state, caches
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]  # A B, B A, ...
        rep = alternate_measured({k: fns[k] for k in order}, 1, warmup=0)
        for k in order:
            results[k]["seconds"] += rep[k]["seconds"]
            results[k]["peak_mb"] += rep[k]["peak_mb"]
        state["i"] += 1

    first = trainers[names[0]]
    tok_metrics = trl_compat.metrics(first, "train")
    tokens_per_step = first.state.num_input_tokens_seen / max(first.state.global_step, 1)
    env_tokens = median(tok_metrics["world/tokens_env"]) if tok_metrics.get("world/tokens_env") else 0.0
    med = {k: {"seconds": median(v["seconds"]), "peak_mb": median(v["peak_mb"])} for k, v in results.items()}
    a, b = med[names[0]], med[names[1]]
    # Paired ratios (same rows, back to back, order alternating): their median is the headline, robust to the
    # load drift of a shared machine; their spread is this machine's noise. The ratio of medians is kept too.
    rep_ratios = [x / y for x, y in zip(results[names[0]]["seconds"], results[names[1]]["seconds"], strict=True)]
    rep_mem = [ratio(x, y) for x, y in zip(results[names[0]]["peak_mb"], results[names[1]]["peak_mb"], strict=True)]
    time_ratio, mem_ratio = median(rep_ratios), median(rep_mem)
    rows = [(k, f"{v['seconds']:.3f}", f"{v['peak_mb']:.0f}") for k, v in med.items()]
    rows.append(("ratio echo / grpo (median of paired)", f"{time_ratio:.3f}", f"{mem_ratio:.3f}"))
    out = {
        "benchmark": "echo_overhead",
        "quick": quick,
        "time_ratio": round(time_ratio, 4),
        "memory_ratio": round(mem_ratio, 4),
        "time_goal": TIME_GOAL,
        "memory_goal": MEMORY_GOAL,
        "time_ratio_of_medians": round(a["seconds"] / b["seconds"], 4),
        "memory_ratio_of_medians": round(ratio(a["peak_mb"], b["peak_mb"]), 4),
        "time_ratio_per_repetition": [round(x, 4) for x in rep_ratios],
        "memory_ratio_per_repetition": [round(x, 4) for x in rep_mem],
        "median_step_seconds": {k: round(v["seconds"], 4) for k, v in med.items()},
        "median_peak_mb": {k: round(v["peak_mb"], 1) for k, v in med.items()},
        "repeats": repeats,
        "batch_rows": n,
        "tokens_per_step": round(tokens_per_step),
        "env_tokens_per_step": env_tokens,
        "model": f"tiny qwen3 random-init, hidden {hidden}, {layers} layers, vocab {len(tokenizer)}",
        "data": "data/episodes library_1 tasks 0-7 (compact tool schemas)",
        "memory_method": memory_method(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
    }
    print(
        f"EchoGRPOTrainer step, lambda=0.05 vs lambda=0 ({out['model']}; {n} trajectories/step, "
        f"~{tokens_per_step:.0f} tokens, {env_tokens:.0f} env tokens; median of {repeats}, alternating)"
    )
    print(f"memory: {out['memory_method']}")
    report(rows, ("variant", "step s", "peak MiB"), out, args)
    return out


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    step_flags(p)
    p.add_argument(
        "--max_completion_length",
        type=int,
        default=None,
        help="cut trajectories (tests use a small value); default: whole AWM trajectories",
    )
    p.add_argument(
        "--no_tool_schemas",
        action="store_true",
        help="drop the tool schemas from the prompts (shorter sequences; the smoke test uses it)",
    )
    return run(p.parse_args(argv))


if __name__ == "__main__":
    ensure_malloc_env()
    main()
