"""EchoGRPOTrainer step time and peak memory vs trajectory length, with a fitted power law.

AWM-shaped synthetic trajectories (a system prompt, a task, then assistant tool calls and JSON tool
outputs in turn) are grown turn by turn to each target length; each length runs the ECHO step
(lambda = 0.05) and the plain GRPO step (lambda = 0) alternately, on identical model copies. The
exponent k of ``cost ~ T**k`` is the least-squares slope in log-log space. The world term itself
is O(T) (a masked mean over per-token log-probs); the backbone's attention is not, so the lambda = 0
column shows what the model alone costs at each length and ``echo / grpo`` what ECHO adds.

    python benchmarks/step/scaling.py [--quick] [--json] [--lengths 1024 2048 4096 8192]
"""

from __future__ import annotations

import copy
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

from common import (  # noqa: E402
    alternate_measured,
    echo_step,
    echo_trainer,
    ensure_malloc_env,
    fit_exponent,
    median,
    memory_method,
    parser,
    report,
    setup,
)


def turn(rng: random.Random, k: int) -> list[dict]:
    from echo_trl.roles import tool_call

    items = [
        {
            "id": rng.randrange(1000),
            "title": f"Item {rng.randrange(100)}",
            "price": round(rng.random() * 90, 2),
            "in_stock": rng.random() > 0.3,
        }
        for _ in range(3)
    ]
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [tool_call("search_items", {"query": f"q{k}", "limit": 3})],
        },
        {"role": "tool", "name": "search_items", "content": json.dumps({"items": items, "total": 3}, indent=2)},
    ]


def trajectory_of_length(tokenizer, target: int, seed: int):
    """A trajectory whose rendered length is just at or above ``target`` tokens."""
    from echo_trl.roles import Trajectory
    from echo_trl.tokens.tokenization import tokenize_with_roles

    rng = random.Random(seed)
    prompt = [
        {"role": "system", "content": "You are a shop agent. Use the tools to complete the task."},
        {"role": "user", "content": "Find the cheapest item in stock and report it."},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "search_items",
                "description": "Search the catalog.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                },
            },
        }
    ]
    completion: list[dict] = []
    k = 0
    while True:
        completion += turn(rng, k)
        k += 1
        traj = Trajectory(
            prompt=prompt,
            completion=completion,
            tools=tools,
            reward=float(seed % 2),
            scenario="synthetic",
            task_idx=0,
            group_id="g0",
        )
        n = len(tokenize_with_roles(tokenizer, traj))
        if n >= target:
            return traj, n


def run(args) -> dict:
    setup(args)
    import torch

    from echo_trl.data.build import trajectories_to_dataset
    from echo_trl.demo.tiny import build_tiny_model, build_tiny_tokenizer

    quick = args.quick
    lengths = args.lengths or ([512, 1024, 2048, 4096] if quick else [1024, 2048, 4096, 8192])
    repeats = args.repeats or (3 if quick else 5)
    hidden = args.hidden_size or 64
    rng = random.Random(0)
    tokenizer = build_tiny_tokenizer("qwen3", [json.dumps(turn(rng, i)) for i in range(50)], vocab_size=1024)
    model = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=2, num_heads=4)
    tmp = tempfile.mkdtemp(prefix="scaling_")
    table, per_length = [], {}
    for T in lengths:
        trajs = [trajectory_of_length(tokenizer, T, seed) for seed in range(2)]
        ds = trajectories_to_dataset([t for t, _ in trajs])
        tokens = sum(n for _, n in trajs) / len(trajs)
        trainers = {
            name: echo_trainer(
                copy.deepcopy(model),
                tokenizer,
                ds,
                f"{tmp}/{name}{T}",
                world_model_coeff=c,
                per_device_train_batch_size=2,
                num_generations=2,
            )
            for name, c in (("echo", 0.05), ("grpo", 0.0))
        }
        rows = {name: list(t.train_dataset) for name, t in trainers.items()}
        fns = {name: (lambda t=t, r=rows[name]: echo_step(t, r)) for name, t in trainers.items()}
        res = {n: {"seconds": [], "peak_mb": []} for n in fns}
        alternate_measured(fns, 0, warmup=1)
        for r in range(repeats):
            order = list(fns) if r % 2 == 0 else list(fns)[::-1]
            rep = alternate_measured({n: fns[n] for n in order}, 1, warmup=0)
            for n in order:
                res[n]["seconds"] += rep[n]["seconds"]
                res[n]["peak_mb"] += rep[n]["peak_mb"]
        med = {n: {m: median(v[m]) for m in v} for n, v in res.items()}
        overhead = median([a / b for a, b in zip(res["echo"]["seconds"], res["grpo"]["seconds"], strict=True)])
        per_length[str(T)] = {
            "tokens_per_trajectory": tokens,
            "echo_seconds": round(med["echo"]["seconds"], 4),
            "echo_peak_mb": round(med["echo"]["peak_mb"], 1),
            "grpo_seconds": round(med["grpo"]["seconds"], 4),
            "grpo_peak_mb": round(med["grpo"]["peak_mb"], 1),
            "echo_over_grpo_time": round(overhead, 4),
        }
        table.append(
            (
                str(T),
                f"{tokens:.0f}",
                f"{med['echo']['seconds']:.3f}",
                f"{med['echo']['peak_mb']:.0f}",
                f"{med['grpo']['seconds']:.3f}",
                f"{med['grpo']['peak_mb']:.0f}",
                f"{overhead:.3f}",
            )
        )
        del trainers, fns
    xs = [per_length[str(T)]["tokens_per_trajectory"] for T in lengths]
    exps = {
        key: round(fit_exponent(xs, [per_length[str(T)][key] for T in lengths]), 3)
        for key in ("echo_seconds", "echo_peak_mb", "grpo_seconds", "grpo_peak_mb")
    }
    out = {
        "benchmark": "scaling",
        "quick": quick,
        "time_exponent": exps["echo_seconds"],
        "memory_exponent": exps["echo_peak_mb"],
        "grpo_time_exponent": exps["grpo_seconds"],
        "grpo_memory_exponent": exps["grpo_peak_mb"],
        "echo_over_grpo_time_ratios": [per_length[str(T)]["echo_over_grpo_time"] for T in lengths],
        "per_length": per_length,
        "repeats": repeats,
        "model": f"tiny qwen3 random-init, hidden {hidden}, 2 layers, vocab {len(tokenizer)}",
        "memory_method": memory_method(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    print(f"step vs trajectory length (2 trajectories/step, {out['model']}; median of {repeats}, alternating)")
    print(f"memory: {out['memory_method']}")
    table.append(
        (
            "fit T^k",
            "",
            f"k={exps['echo_seconds']}",
            f"k={exps['echo_peak_mb']}",
            f"k={exps['grpo_seconds']}",
            f"k={exps['grpo_peak_mb']}",
            "",
        )
    )
    report(table, ("target T", "tokens", "echo s", "echo MiB", "grpo s", "grpo MiB", "echo/grpo"), out, args)
    return out


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    p.add_argument("--lengths", type=int, nargs="+", default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--hidden_size", type=int, default=None)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    ensure_malloc_env()
    main()
