"""Prefix sharing: forward+backward of an AWM-shaped GRPO micro-batch, shared vs unshared vs packed.

One micro-batch = the G trajectories of one group: a prompt of ``preamble`` tokens (system prompt +
tool schemas) plus a ~150-token task, and completions of a few hundred to ~1.5k tokens, 70 % env
output. Each variant computes the per-token log-probs (and entropies) of the completion tokens, a
GRPO-style loss on the action tokens + 0.1 x ECHO's world loss (``echo_trl.train.step.loss.world_loss``) on
the env tokens, and its backward (no optimizer step):

* ``unshared``: TRL 1.16's own forward, the call inside ``GRPOTrainer._get_per_token_logps_and_entropies``
  reproduced without a trainer: ``cat(prompt, completion)`` padded, labels masked to the completion,
  ``model(..., labels=labels, fused_lm_head=True)`` on the model ``add_fused_lm_head`` patched;
* ``packed``: the same tokens packed padding-free, nothing shared: what ``SFTTrainer(packing=True)``
  forwards (every row's tokens once, no padding; here through the same per-row SDPA attention);
* ``shared``: ``echo_trl.prefix.attention.shared_logps``, the group's prompt forwarded once.

Same random-init Qwen3-architecture model for all (fp32, SDPA); repetitions alternate the order
(A B C, C B A, ...) and ratios are medians of per-repetition ratios, so machine load hits all alike.

    python benchmarks/step/prefix_sharing.py [--quick] [--json] [--groups 4 8 16] [--preambles 2048 8192]

``--trainer``: the real ``EchoGRPOTrainer`` instead, whole offline optimizer steps (collate from the token
cache, TRL's loss forward, world term, backward, AdamW) with ``prefix_sharing`` true vs false on AWM-shaped
data: a GRPO group of G trajectories sharing one bundled AWM prompt (``library_1``, full tool schemas), each
with another captured episode's completion; micro-batch = the group.

    python benchmarks/step/prefix_sharing.py --trainer [--quick] [--json] [--groups 8]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

from common import (  # noqa: E402
    bundled_dataset,
    corpus_of,
    echo_step,
    echo_trainer,
    ensure_malloc_env,
    measure_call,
    median,
    memory_method,
    parser,
    report,
    setup,
)

GOAL_SPEEDUP, GOAL_MEMORY, GOAL_AT = 2.5, 0.5, (8, 8192)
TASK_TOKENS, ACTION_SPAN, ENV_SPAN = 150, 30, 70  # completions alternate 30 action / 70 env tokens


def build_model(vocab: int, hidden: int, layers: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from echo_trl.prefix.attention import enable_prefix_tree_attention

    heads = max(2, hidden // 64)
    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        head_dim=hidden // heads,
        max_position_embeddings=65536,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # as GRPOTrainer does at init
    enable_prefix_tree_attention(model)  # plain (unshared) calls stay SDPA
    model.train()
    return model


def make_group(G: int, preamble: int, lo: int, hi: int, vocab: int, seed: int):
    """One group's micro-batch in TRL's layout, with its action / env masks and advantages."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, vocab, (preamble + TASK_TOKENS,), generator=g)
    lengths = torch.randint(lo, hi + 1, (G,), generator=g)
    C = int(lengths.max())
    completion = torch.randint(3, vocab, (G, C), generator=g)
    cmask = (torch.arange(C)[None] < lengths[:, None]).long()
    ids = torch.cat([prompt.expand(G, -1), completion * cmask], 1)
    mask = torch.cat([torch.ones(G, len(prompt), dtype=torch.long), cmask], 1)
    env = ((torch.arange(C) % (ACTION_SPAN + ENV_SPAN)) >= ACTION_SPAN)[None] & cmask.bool()
    action = ~env & cmask.bool()
    return ids, mask, C, env, action, torch.randn(G, generator=g)


def loss_of(logps, env, action, adv):
    """GRPO-style policy term on the action tokens + 0.1 x ECHO's world term on the env tokens."""
    import torch

    from echo_trl.train.step.loss import world_loss

    ratio = torch.exp(logps - logps.detach())
    policy = (-(ratio * adv[:, None]) * action).sum(-1) / action.sum(-1).clamp(min=1)
    return policy.mean() + 0.1 * world_loss(logps, env, normalization="token").loss


def variants(model, ids, mask, k, env, action, adv):
    from echo_trl.prefix.attention import shared_logps

    def unshared():
        labels = ids.masked_fill(mask == 0, -100)  # TRL 1.16 _get_per_token_logps_and_entropies
        labels[:, :-k] = -100
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        return out.log_probs[:, -k:]

    def step(fn):
        def run():
            model.zero_grad(set_to_none=True)
            logps = fn()
            loss_of(logps, env, action, adv).backward()
            return logps.detach()

        return run

    return {
        "unshared": step(unshared),
        "packed": step(
            lambda: shared_logps(model, ids, mask, k, compute_entropy=True, min_shared_tokens=1 << 40).logps
        ),
        "shared": step(lambda: shared_logps(model, ids, mask, k, compute_entropy=True).logps),
    }


def measure_variants(fns: dict, repeats: int) -> tuple[dict, dict]:
    """Seconds and peak memory of each variant, ``repeats`` times in alternating order (A B C, C B A, ...);
    and each variant's log-probs from its first run (to check they agree)."""
    res = {n: {"seconds": [], "peak_mb": []} for n in fns}
    firsts = {}
    for r in range(repeats):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            holder: dict = {}
            dt, mb = measure_call(lambda fn=fns[name], holder=holder: holder.setdefault("lp", fn()))
            res[name]["seconds"].append(dt)
            res[name]["peak_mb"].append(mb)
            firsts.setdefault(name, holder["lp"])
    return res, firsts


def ratio(res: dict, a: str, b: str, metric: str) -> float | None:
    """Median of the per-repetition ratios a / b (None for memory when b grew less than a MiB: RSS noise)."""
    if metric == "peak_mb" and min(res[b][metric]) < 1.0:
        return None
    return round(median([x / y for x, y in zip(res[a][metric], res[b][metric], strict=True)]), 3)


def awm_sharing(batch_sizes: list[int], seed: int = 0) -> dict:
    """Tokens per forwarded token on the bundled AWM episodes (``data/episodes``: ``library_1``, full tool
    schemas), micro-batches cut from the grouped epoch order vs a uniformly shuffled one."""
    import numpy as np

    from echo_trl.demo.tiny import build_tiny_tokenizer
    from echo_trl.prefix.order import prefix_grouped_order
    from echo_trl.prefix.tree import build_prefix_tree
    from echo_trl.train.offline.collator import CollatorSettings, trajectory_features

    ds = bundled_dataset(compact_tools=False)
    tok = build_tiny_tokenizer("qwen3", corpus_of(ds), vocab_size=4096)
    feats = [trajectory_features(tok, row, CollatorSettings()) for row in ds]
    rows = [f.prompt_ids + f.completion_ids for f in feats]
    orders = {
        "grouped": prefix_grouped_order(ds["group_id"], ds["scenario"], seed=seed, epoch=0),
        "shuffled": np.random.default_rng(seed).permutation(len(ds)).tolist(),
    }
    out = {
        "episodes": len(ds),
        "groups": len(set(ds["group_id"])),
        "mean_prompt_tokens": round(float(np.mean([len(f.prompt_ids) for f in feats]))),
        "mean_completion_tokens": round(float(np.mean([len(f.completion_ids) for f in feats]))),
    }
    for b in batch_sizes:
        for name, order in orders.items():
            trees = [build_prefix_tree([rows[j] for j in order[i : i + b]]) for i in range(0, len(order) - b + 1, b)]
            out[f"{name}_b{b}"] = round(sum(t.total_tokens for t in trees) / sum(t.num_tokens for t in trees), 2)
    return out


def mem_available_mb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def run(args) -> dict:
    setup(args)
    import torch

    from echo_trl.prefix.tree import build_prefix_tree, rows_from_padded

    quick = args.quick
    groups = args.groups or ([4, 8] if quick else [4, 8, 16])
    preambles = args.preambles or ([2048] if quick else [2048, 8192])
    lo, hi = args.completion_range or ((200, 600) if quick else (300, 1500))
    hidden = args.hidden_size or 128
    layers = args.num_layers or 2
    repeats = args.repeats or 2
    model = build_model(args.vocab_size, hidden, layers)
    for fn in variants(model, *make_group(2, 64, 16, 32, args.vocab_size, 0)).values():
        fn()  # warm-up once (allocator, kernels), not per shape: the large unshared shapes are minutes each
    rows, per_shape = [], {}
    for P in preambles:
        for G in groups:
            batch = make_group(G, P, lo, hi, args.vocab_size, seed=G * 100003 + P)
            ids, mask, k = batch[:3]
            tree = build_prefix_tree(*rows_from_padded(ids.numpy(), mask.numpy(), k)[:2])
            # unshared keeps the activations of every padded token for backward; skip what won't fit
            need_mb = ids.numel() * layers * hidden * 110 * 4 / 2**20  # measured: 105 fp32 / token / layer at G16 P8k
            key = f"G{G}_P{P}"
            if need_mb > 0.7 * mem_available_mb():
                print(f"skip {key}: the unshared step needs ~{need_mb:.0f} MiB", file=sys.stderr)
                per_shape[key] = {"skipped": f"needs ~{need_mb:.0f} MiB"}
                continue
            res, firsts = measure_variants(variants(model, *batch), repeats)
            diff = max(float((firsts[n] - firsts["unshared"]).abs().max()) for n in ("shared", "packed"))
            per_rep = lambda a, b, m, res=res: ratio(res, a, b, m)  # noqa: E731
            med = {n: {m: median(v[m]) for m in v} for n, v in res.items()}
            row_tokens = int(mask.sum())
            out = {
                "G": G,
                "preamble": P,
                "completion_tokens": int(mask[:, -k:].sum()),
                "row_tokens": row_tokens,
                "padded_tokens": ids.numel(),
                "forwarded_tokens_shared": tree.num_tokens,
                "seconds": {n: round(med[n]["seconds"], 3) for n in med},
                "peak_mb": {n: round(med[n]["peak_mb"], 1) for n in med},
                "speedup_vs_unshared": per_rep("unshared", "shared", "seconds"),
                "speedup_vs_packed": per_rep("packed", "shared", "seconds"),
                "memory_ratio_vs_unshared": per_rep("shared", "unshared", "peak_mb"),
                "memory_ratio_vs_packed": per_rep("shared", "packed", "peak_mb"),
                "tokens_per_second": {n: round(row_tokens / med[n]["seconds"]) for n in med},
                "max_abs_logp_diff": diff,
            }
            per_shape[key] = out
            rows.append(
                (
                    str(G),
                    str(P),
                    str(row_tokens),
                    str(tree.num_tokens),
                    *(f"{med[n]['seconds']:.2f}" for n in ("unshared", "packed", "shared")),
                    f"{out['speedup_vs_unshared']:.2f}x",
                    f"{out['speedup_vs_packed']:.2f}x",
                    *(f"{med[n]['peak_mb']:.0f}" for n in ("unshared", "packed", "shared")),
                    str(out["memory_ratio_vs_unshared"]),
                    f"{diff:.1e}",
                )
            )
            del batch, ids, mask, firsts
    awm = awm_sharing([4, 8, 16])
    goal = per_shape.get(f"G{GOAL_AT[0]}_P{GOAL_AT[1]}", {})
    result = {
        "benchmark": "prefix_sharing",
        "quick": quick,
        "per_shape": per_shape,
        "awm_tokens_per_forwarded_token": awm,
        "speedup_at_goal_shape": goal.get("speedup_vs_unshared"),
        "memory_ratio_at_goal_shape": goal.get("memory_ratio_vs_unshared"),
        "goal": {
            "shape": f"G={GOAL_AT[0]}, preamble={GOAL_AT[1]}",
            "speedup": GOAL_SPEEDUP,
            "memory_ratio": GOAL_MEMORY,
        },
        "model": f"random-init qwen3, hidden {hidden}, {layers} layers, vocab {args.vocab_size}, fp32, SDPA",
        "completion_range": [lo, hi],
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "memory_method": memory_method(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "unshared_path": "TRL 1.16 GRPOTrainer._get_per_token_logps_and_entropies call (fused LM head), reproduced",
    }
    print(
        f"forward+backward of one group's micro-batch ({result['model']}; completions {lo}-{hi} tokens; "
        f"median of {repeats}, alternating order)"
    )
    print(f"memory: {result['memory_method']}")
    print(
        f"bundled AWM episodes ({awm['episodes']} episodes, {awm['groups']} groups, "
        f"prompt ~{awm['mean_prompt_tokens']} / completion ~{awm['mean_completion_tokens']} tokens), "
        "tokens per forwarded token, micro-batch 4/8/16: "
        + ", ".join(f"{n} " + "/".join(str(awm[f"{n}_b{b}"]) for b in (4, 8, 16)) for n in ("grouped", "shuffled"))
    )
    report(
        rows,
        (
            "G",
            "preamble",
            "row tok",
            "fwd tok",
            "unshared s",
            "packed s",
            "shared s",
            "vs unsh",
            "vs packed",
            "unsh MiB",
            "packed MiB",
            "shared MiB",
            "mem ratio",
            "max|dlogp|",
        ),
        result,
        args,
    )
    return result


def awm_group(G: int, max_completion: int, compact_tools: bool = False):
    """A group of ``G`` AWM-shaped trajectories: one bundled episode's prompt (system prompt + tool schemas, full
    unless ``compact_tools``, + task), each with another bundled episode's completion (cut to ``max_completion``
    tokens by the trainer)."""
    from echo_trl.data.build import trajectories_to_dataset
    from echo_trl.data.schema import row_to_trajectory
    from echo_trl.demo.tiny import build_tiny_tokenizer

    ds = bundled_dataset(compact_tools=compact_tools)
    base = row_to_trajectory(ds[0])
    group = []
    for i in range(G):
        t = row_to_trajectory(ds[1 + i % (len(ds) - 1)])
        t.prompt, t.tools, t.group_id, t.scenario, t.reward = base.prompt, base.tools, "g0", base.scenario, i % 3 / 2
        group.append(t)
    return trajectories_to_dataset(group), build_tiny_tokenizer("qwen3", corpus_of(ds), vocab_size=4096)


def run_trainer(args) -> dict:
    """``prefix_sharing`` true vs false in the real trainer: step time and peak memory, alternating order."""
    setup(args)
    import tempfile

    import torch

    from echo_trl.demo.tiny import build_tiny_model
    from echo_trl.train import trl_compat
    from echo_trl.train.model import context_length
    from echo_trl.train.offline.collator import CollatorSettings
    from echo_trl.train.offline.recorded import collate_batch

    G = (args.groups or [8])[0]
    max_completion = (args.completion_range or (None, 512 if args.quick else 1536))[1]
    repeats = args.repeats or (2 if args.quick else 4)
    hidden, layers = args.hidden_size or 128, args.num_layers or 2
    ds, tok = awm_group(G, max_completion)
    trainers, tmp = {}, tempfile.mkdtemp()
    for name, share in (("unshared", False), ("shared", True)):
        model = build_tiny_model(tok, "qwen3", hidden_size=hidden, num_layers=layers, num_heads=max(2, hidden // 64))
        trainers[name] = echo_trainer(
            model,
            tok,
            ds,
            f"{tmp}/{name}",
            per_device_train_batch_size=G,
            max_completion_length=max_completion,
            prefix_sharing=share,
            world_model_coeff=0.05,
            shuffle_dataset=False,
        )
    rows = list(trainers["shared"].train_dataset)
    fns = {n: (lambda t=t: echo_step(t, rows)) for n, t in trainers.items()}
    for fn in fns.values():
        fn()  # warm-up
    res = {n: {"seconds": [], "peak_mb": []} for n in fns}
    for r in range(repeats):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            dt, mb = measure_call(fns[name])
            res[name]["seconds"].append(dt)
            res[name]["peak_mb"].append(mb)
    shared_trainer = trainers["shared"]
    packing = trl_compat.metrics(shared_trainer, "train").get("batch/packing_ratio", [])  # (own, run) pairs
    settings = CollatorSettings.from_args(shared_trainer.args, context_length(shared_trainer.model))
    features = collate_batch(shared_trainer, rows, settings)
    prompt, completion = int(features["prompt_mask"].sum()), int(features["completion_mask"].sum())
    med = {n: {m: median(v[m]) for m in v} for n, v in res.items()}
    result = {
        "benchmark": "prefix_sharing_trainer",
        "quick": args.quick,
        "G": G,
        "prompt_tokens": prompt // G,
        "completion_tokens": completion,
        "forwarded_fraction": round(packing[-1][1] / packing[-1][0], 3) if packing else None,
        "seconds": {n: round(med[n]["seconds"], 3) for n in med},
        "peak_mb": {n: round(med[n]["peak_mb"], 1) for n in med},
        "speedup": ratio(res, "unshared", "shared", "seconds"),
        "memory_ratio": ratio(res, "shared", "unshared", "peak_mb"),
        "model": f"random-init qwen3, hidden {hidden}, {layers} layers, tiny AWM tokenizer (vocab 4096), fp32",
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "memory_method": memory_method(),
    }
    print(
        f"EchoGRPOTrainer offline optimizer step, one group of {G} ({result['model']}; median of {repeats}, "
        f"alternating order; memory: {result['memory_method']})"
    )
    report(
        [
            (
                str(G),
                str(prompt // G),
                str(completion),
                str(result["forwarded_fraction"]),
                *(f"{med[n]['seconds']:.2f}" for n in ("unshared", "shared")),
                f"{result['speedup']}x",
                *(f"{med[n]['peak_mb']:.0f}" for n in ("unshared", "shared")),
                str(result["memory_ratio"]),
            )
        ],
        (
            "G",
            "prompt tok",
            "completion tok",
            "fwd fraction",
            "unshared s",
            "shared s",
            "speedup",
            "unsh MiB",
            "shared MiB",
            "mem ratio",
        ),
        result,
        args,
    )
    return result


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    p.add_argument("--groups", type=int, nargs="+", default=None, help="trajectories per group (G)")
    p.add_argument("--preambles", type=int, nargs="+", default=None, help="shared preamble tokens")
    p.add_argument("--completion_range", type=int, nargs=2, default=None, metavar=("LO", "HI"))
    p.add_argument(
        "--vocab_size",
        type=int,
        default=1024,
        help="small: on CPU TRL's fused head holds a fixed 32768 x vocab fp32 tile, which would swamp a "
        "tiny backbone's activations (in a real model the activations dominate)",
    )
    p.add_argument("--hidden_size", type=int, default=None)
    p.add_argument("--num_layers", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--trainer", action="store_true", help="real EchoGRPOTrainer steps, prefix_sharing true vs false")
    args = p.parse_args(argv)
    return run_trainer(args) if args.trainer else run(args)


if __name__ == "__main__":
    ensure_malloc_env()
    main()
