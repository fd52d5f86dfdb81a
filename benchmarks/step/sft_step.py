"""EchoSFTTrainer's step against TRL's SFTTrainer's on the same tokens (the cost of the role weights).

Both trainers get identical copies of one tiny random-init Qwen3-architecture model and the same tool-use
conversations: the bundled AWM episodes (``data/episodes``) as a ``messages`` dataset with their tool schemas. TRL
tokenizes both the same way (same template, same ``input_ids``); EchoSFTTrainer adds the role weights
(observation and action weight at their defaults, 1) in the labels and computes the weighted loss, SFTTrainer its
own. A step is collate + forward + backward + AdamW + zero grad for both, on the same rows; repetitions alternate
the order. Goal: at most 1.05x.

    python benchmarks/step/sft_step.py [--quick] [--json]
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

from common import (  # noqa: E402
    bundled_dataset,
    corpus_of,
    ensure_malloc_env,
    median,
    memory_method,
    paired_over_batches,
    parser,
    report,
    setup,
    step_flags,
)

GOAL = 1.05


def messages_dataset(max_rows: int | None, with_tools: bool):
    """The bundled episodes as a Hub-shaped tool-use ``messages`` dataset (``messages``, and ``tools`` when
    ``with_tools``: the AWM schemas are thousands of tokens, all system prompt)."""
    from datasets import Dataset

    ds = bundled_dataset()
    rows = [{"messages": [_hub_message(m) for m in (*r["prompt"], *r["completion"])]} for r in ds]
    if with_tools:  # one JSON string per row, as Hub datasets store schemas (an Arrow struct would unify their keys)
        for row, r in zip(rows, ds, strict=True):
            row["tools"] = json.dumps([json.loads(t) for t in r["tools"]])
    return Dataset.from_list(rows[:max_rows] if max_rows else rows), ds


def _hub_message(message: dict) -> dict:
    """A message as Hub tool-calling datasets store it: no empty keys, tool-call arguments as JSON text."""
    out = {k: v for k, v in message.items() if v is not None}
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
            }
            for c in out["tool_calls"]
        ]
    return out


def trainer(cls, config_cls, model, tokenizer, dataset, output_dir: str, batch: int, max_length: int):
    config = config_cls(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        max_length=max_length,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        gradient_checkpointing=False,
        disable_tqdm=True,
        seed=0,
    )
    t = cls(model, args=config, train_dataset=dataset, processing_class=tokenizer)
    t.model.train()
    t.current_gradient_accumulation_steps = 1
    t.create_optimizer()
    return t


def step(t, examples: list[dict]) -> float:
    """One optimizer step as ``Trainer.train`` runs it (the divisor as ``get_batch_samples`` gives it)."""
    batch = t.data_collator(examples)
    _, num_items = t.get_batch_samples(iter([batch]), 1, t.args.device)
    loss = t.training_step(t.model, batch, num_items)
    t.optimizer.step()
    t.model.zero_grad(set_to_none=True)
    return float(loss)


def run(args) -> dict:
    setup(args)
    import torch
    from trl import SFTConfig, SFTTrainer

    from echo_trl import EchoSFTConfig, EchoSFTTrainer
    from echo_trl.demo.tiny import build_tiny_model, build_tiny_tokenizer

    torch.manual_seed(0)
    quick = args.quick
    hidden, layers = (args.hidden_size or (64 if quick else 128)), (args.num_layers or 2)
    batch, repeats = args.batch_size or 2, args.repeats or (5 if quick else 9)
    max_length = args.max_length or (2048 if quick else 8192)
    dataset, trajectories = messages_dataset(8 if quick else None, args.tool_schemas)
    tokenizer = build_tiny_tokenizer("qwen3", corpus_of(trajectories), vocab_size=2048)
    model = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=4)
    tmp = tempfile.mkdtemp(prefix="sft_step_")
    common = (tokenizer, dataset)
    echo = trainer(EchoSFTTrainer, EchoSFTConfig, copy.deepcopy(model), *common, tmp + "/e", batch, max_length)
    sft = trainer(SFTTrainer, SFTConfig, copy.deepcopy(model), *common, tmp + "/s", batch, max_length)
    echo_rows, sft_rows = list(echo.train_dataset), list(sft.train_dataset)
    same = all(a["input_ids"] == b["input_ids"] for a, b in zip(echo_rows, sft_rows, strict=True))
    if not same:
        raise SystemExit("the two trainers tokenized the conversations differently: no like-for-like timing")
    weighted = sum(max(r.get("labels") or [0]) >= 1 << 32 for r in echo_rows)
    steps = {"EchoSFTTrainer": lambda s: step(echo, echo_rows[s]), "SFTTrainer": lambda s: step(sft, sft_rows[s])}
    med, ratios, mem_ratios = paired_over_batches(steps, len(echo_rows), batch, repeats)
    tokens = sum(len(echo_rows[i]["input_ids"]) for i in range(batch))
    out = {
        "benchmark": "sft_step",
        "quick": quick,
        "time_ratio": round(median(ratios), 4),
        "memory_ratio": round(median(mem_ratios), 4),
        "time_goal": GOAL,
        "time_ratio_per_repetition": [round(x, 4) for x in ratios],
        "median_step_seconds": {k: round(v["seconds"], 4) for k, v in med.items()},
        "median_peak_mb": {k: round(v["peak_mb"], 1) for k, v in med.items()},
        "repeats": repeats,
        "batch_rows": batch,
        "rows_with_role_weights": f"{weighted}/{len(echo_rows)}",
        "tokens_first_batch": tokens,
        "model": f"tiny qwen3 random-init, hidden {hidden}, {layers} layers, vocab {len(tokenizer)}",
        "memory_method": memory_method(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    table = [(k, f"{v['seconds']:.3f}", f"{v['peak_mb']:.0f}") for k, v in med.items()]
    table.append(("ratio echo / trl (median of paired)", f"{out['time_ratio']:.3f}", f"{out['memory_ratio']:.3f}"))
    print(
        f"EchoSFTTrainer step vs SFTTrainer step, same tokens ({out['model']}; {batch} conversations/step, "
        f"~{tokens} tokens; {out['rows_with_role_weights']} rows with role weights; median of {repeats}, alternating)"
    )
    print(f"memory: {out['memory_method']}")
    report(table, ("trainer", "step s", "peak MiB"), out, args)
    return out


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    step_flags(p)
    p.add_argument("--max_length", type=int, default=None, help="TRL's max_length (default 2048 quick, else 8192)")
    p.add_argument("--tool_schemas", action="store_true", help="keep the AWM tool schemas in the prompts")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    ensure_malloc_env()
    main()
