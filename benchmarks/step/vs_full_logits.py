"""The world term as echo_trl computes it vs the seeds' approach (full ``log_softmax`` over [B, T, V]).

Both variants compute the ECHO world-model loss (mean CE over env-output tokens of the completion)
and its backward, on the same random-init Qwen3-architecture model with a large vocabulary
(151,936 by default, Qwen2.5/Qwen3's):

* ``echo_trl``: the per-token log-probs of TRL's own GRPO forward (``add_fused_lm_head``:
  ``model(..., labels=..., fused_lm_head=True).log_probs``, the LM head applied tile by tile
  without ever holding the [T, V] logits, exactly the call in ``GRPOTrainer._get_per_token_logps_and_entropies``),
  then ``echo_trl.train.step.loss.world_loss`` on them;
* ``full_logits``: ``model(...).logits`` ([B, T, V]), ``log_softmax`` in float32, ``gather``, masked
  mean: the seeds' world term.

Peak memory is measured above the level at the start of each call (CPU: resident-set high-water
mark reset through ``/proc/self/clear_refs``; CUDA: the allocator's peak). Every length runs
both variants alternately, several times; medians. On CPU the backbone is small (``--hidden_size``):
its size does not change the logits' memory, which is what this benchmark is about.

    python benchmarks/step/vs_full_logits.py [--quick] [--json] [--lengths 1024 4096 8192] [--vocab_size 151936]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

from common import alternate_measured, ensure_malloc_env, median, memory_method, parser, report, setup  # noqa: E402

GOAL_MEMORY_AT_8K = 0.25


def mem_available_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def build_model(vocab: int, hidden: int, layers: int, dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64) * 2 or 2,
        num_key_value_heads=max(1, hidden // 64),
        head_dim=32 if hidden < 128 else 64,
        max_position_embeddings=65536,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    add_fused_lm_head(model)  # what GRPOTrainer does to its model at init
    model.train()
    return model


def make_batch(batch: int, length: int, vocab: int, device):
    """Random ids; the last 75 % is the completion, of which every other 40-token span is env output."""
    import torch

    g = torch.Generator().manual_seed(length)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    k = (3 * length) // 4  # logits_to_keep: completion length
    world = torch.zeros(batch, k, dtype=torch.bool)
    for s in range(0, k, 80):
        world[:, s : s + 40] = True
    return ids.to(device), torch.ones_like(ids).to(device), k, world.to(device)


def echo_world_term(model, ids, attn, k, world):
    """As echo_trl: TRL's fused forward gives completion log-probs; the world term is a masked mean of them."""
    from echo_trl.train.step.loss import world_loss

    labels = ids.masked_fill(attn == 0, -100)  # TRL 1.16 GRPOTrainer._get_per_token_logps_and_entropies
    labels[:, :-k] = -100
    logps = model(input_ids=ids, attention_mask=attn, labels=labels, fused_lm_head=True).log_probs[:, -k:]
    loss = world_loss(logps, world, normalization="token").loss
    loss.backward()
    return loss.detach()


def full_logits_world_term(model, ids, attn, k, world):
    """The seeds' way: full [B, T, V] logits, log_softmax over the vocabulary, gather, masked mean."""
    import torch

    logits = model(input_ids=ids, attention_mask=attn).logits[:, -k - 1 : -1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, -k:].unsqueeze(-1)).squeeze(-1)
    loss = -(logp * world).sum() / world.sum()
    loss.backward()
    return loss.detach()


def run(args) -> dict:
    setup(args)
    import torch

    quick = args.quick
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lengths = args.lengths or ([256, 512, 1024] if quick else [1024, 4096, 8192])
    vocab = args.vocab_size
    hidden = args.hidden_size or (1024 if device == "cuda" else 64)
    layers = args.num_layers or (2 if device == "cuda" else 1)
    batch = args.batch_size or 1
    repeats = args.repeats or (2 if quick else 3)
    model = build_model(vocab, hidden, layers, dtype).to(device)
    bytes_per = 2 if dtype == torch.bfloat16 else 4
    table, per_length = [], {}
    for T in lengths:
        # full_logits peaks at ~3.3 [B, T, V] fp32 tensors (measured at T = 2k and 4k: logits, log_softmax,
        # their gradients, partly freed on the way); 3.5 leaves a margin
        need_gib = 3.5 * batch * T * vocab * 4 / 2**30
        if device == "cpu" and need_gib > 0.8 * mem_available_gib():
            print(
                f"skip T={T}: full logits need ~{need_gib:.1f} GiB, {mem_available_gib():.1f} GiB available",
                file=sys.stderr,
            )
            per_length[str(T)] = {"skipped": f"needs ~{need_gib:.1f} GiB"}
            continue
        ids, attn, k, world = make_batch(batch, T, vocab, device)

        def echo_fn(ids=ids, attn=attn, k=k, world=world):
            model.zero_grad(set_to_none=True)
            return echo_world_term(model, ids, attn, k, world)

        def full_fn(ids=ids, attn=attn, k=k, world=world):
            model.zero_grad(set_to_none=True)
            return full_logits_world_term(model, ids, attn, k, world)

        a, b = float(echo_fn()), float(full_fn())  # warm-up, and the two must agree
        res = {"echo_trl": {"seconds": [], "peak_mb": []}, "full_logits": {"seconds": [], "peak_mb": []}}
        for r in range(repeats):
            order = [("echo_trl", echo_fn), ("full_logits", full_fn)]
            if r % 2:
                order.reverse()
            rep = alternate_measured(dict(order), 1, warmup=0)
            for name in rep:
                res[name]["seconds"] += rep[name]["seconds"]
                res[name]["peak_mb"] += rep[name]["peak_mb"]
        model.zero_grad(set_to_none=True)
        med = {n: {m: median(v[m]) for m in v} for n, v in res.items()}
        # below a page of growth the RSS delta is noise: no ratio then
        mem_ratio = (
            med["echo_trl"]["peak_mb"] / med["full_logits"]["peak_mb"]
            if med["full_logits"]["peak_mb"] >= 1.0
            else float("nan")
        )
        time_ratio = median(
            [x / y for x, y in zip(res["echo_trl"]["seconds"], res["full_logits"]["seconds"], strict=True)]
        )
        per_length[str(T)] = {
            "memory_ratio": round(mem_ratio, 4) if mem_ratio == mem_ratio else None,
            "time_ratio": round(time_ratio, 4),
            "echo_trl_peak_mb": round(med["echo_trl"]["peak_mb"], 1),
            "full_logits_peak_mb": round(med["full_logits"]["peak_mb"], 1),
            "echo_trl_seconds": round(med["echo_trl"]["seconds"], 4),
            "full_logits_seconds": round(med["full_logits"]["seconds"], 4),
            "loss_abs_diff": abs(a - b),
            "logits_fp32_mb": round(batch * T * vocab * bytes_per / 2**20, 1),
        }
        table.append(
            (
                str(T),
                f"{med['echo_trl']['peak_mb']:.0f}",
                f"{med['full_logits']['peak_mb']:.0f}",
                f"{mem_ratio:.3f}",
                f"{med['echo_trl']['seconds']:.3f}",
                f"{med['full_logits']['seconds']:.3f}",
                f"{time_ratio:.3f}",
                f"{abs(a - b):.1e}",
            )
        )
        del ids, attn, world
    measured = [t for t in lengths if per_length[str(t)].get("memory_ratio") is not None]
    longest = max(measured) if measured else None
    out = {
        "benchmark": "vs_full_logits",
        "quick": quick,
        "memory_ratio": per_length[str(longest)]["memory_ratio"] if longest else None,
        "time_ratio": per_length[str(longest)]["time_ratio"] if longest else None,
        "at_length": longest,
        "memory_goal_at_8k": GOAL_MEMORY_AT_8K,
        "memory_ratio_at_8k": per_length.get("8192", {}).get("memory_ratio"),
        "per_length": per_length,
        "vocab_size": vocab,
        "batch": batch,
        "repeats": repeats,
        "model": f"random-init qwen3, hidden {hidden}, {layers} layer(s), vocab {vocab}, {str(dtype).split('.')[-1]}",
        "memory_method": memory_method(),
        "device": device,
    }
    print(
        f"world term forward+backward: echo_trl (TRL fused log-probs) vs full log_softmax logits "
        f"({out['model']}, batch {batch}; median of {repeats}, alternating)"
    )
    print(f"memory: {out['memory_method']}")
    report(table, ("T", "echo MiB", "full MiB", "mem ratio", "echo s", "full s", "time ratio", "|dloss|"), out, args)
    return out


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    p.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths T")
    p.add_argument("--vocab_size", type=int, default=151936)
    p.add_argument("--hidden_size", type=int, default=None)
    p.add_argument("--num_layers", type=int, default=None)
    p.add_argument("--batch_size", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    ensure_malloc_env()
    main()
