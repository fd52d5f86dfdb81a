"""The floor: an offline ECHO step vs a TRL ``SFTTrainer`` step on the same tokens.

Supervised fine-tuning is one forward + one backward over the sequence, the least any trainer
that learns from these tokens can do. Both trainers get identical copies of one tiny random-init
Qwen3-architecture model and the same AWM trajectories (``data/episodes``, ``library_1`` tasks
0-7): ECHO tokenizes each row with its roles at every step (as in training), SFT gets exactly
those token ids pre-tokenized (``input_ids`` column; loss on every token). A step is
collate + forward + backward + AdamW + zero grad for both; repetitions alternate the order.

    python benchmarks/step/vs_sft.py [--quick] [--json]
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

from common import (  # noqa: E402
    bundled_dataset,
    corpus_of,
    echo_step,
    echo_trainer,
    ensure_malloc_env,
    median,
    memory_method,
    paired_over_batches,
    parser,
    report,
    setup,
    step_flags,
)

GOAL = 1.15


def sft_trainer(model, tokenizer, id_rows: list[list[int]], output_dir: str, batch: int):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    ds = Dataset.from_dict({"input_ids": id_rows})
    config = SFTConfig(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        max_length=None,
        packing=False,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        gradient_checkpointing=False,
        disable_tqdm=True,
        dataset_num_proc=None,
        seed=0,
    )
    trainer = SFTTrainer(model, args=config, train_dataset=ds, processing_class=tokenizer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer.create_optimizer()
    return trainer


def sft_step(trainer, examples: list[dict]) -> float:
    batch = trainer.data_collator(examples)
    loss = trainer.training_step(trainer.model, batch, None)
    trainer.optimizer.step()
    trainer.model.zero_grad(set_to_none=True)
    return float(loss)


def run(args) -> dict:
    setup(args)
    import torch

    from echo_trl.demo.tiny import build_tiny_model, build_tiny_tokenizer
    from echo_trl.train.offline.collator import CollatorSettings, trajectory_features

    torch.manual_seed(0)
    quick = args.quick
    hidden, layers = (args.hidden_size or (64 if quick else 128)), (args.num_layers or 2)
    batch, repeats = args.batch_size or 2, args.repeats or (3 if quick else 5)
    ds = bundled_dataset()
    if args.no_tool_schemas:
        ds = ds.map(lambda r: {"tools": []})
    train = ds.filter(lambda r: r["task_idx"] < 8)
    tokenizer = build_tiny_tokenizer("qwen3", corpus_of(ds), vocab_size=2048)
    model = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=4)
    tmp = tempfile.mkdtemp(prefix="vs_sft_")
    echo = echo_trainer(
        copy.deepcopy(model),
        tokenizer,
        train,
        tmp + "/echo",
        world_model_coeff=0.05,
        per_device_train_batch_size=batch,
        num_generations=2,
        max_completion_length=args.max_completion_length,
    )
    rows = list(echo.train_dataset)
    settings = CollatorSettings.from_args(echo.args)
    id_rows = []
    for row in rows:  # exactly the ids the ECHO trainer trains on (same truncation)
        f = trajectory_features(tokenizer, row, settings)
        id_rows.append(f.prompt_ids + f.completion_ids)
    sft = sft_trainer(copy.deepcopy(model), tokenizer, id_rows, tmp + "/sft", batch)
    sft_examples = list(sft.train_dataset)
    steps = {"echo (lambda=0.05)": lambda s: echo_step(echo, rows[s]), "sft": lambda s: sft_step(sft, sft_examples[s])}
    med, ratios, mem_ratios = paired_over_batches(steps, len(rows), batch, repeats)
    names = list(steps)
    tokens = sum(len(id_rows[i]) for i in range(batch)) if id_rows else 0
    out = {
        "benchmark": "vs_sft",
        "quick": quick,
        "time_ratio": round(median(ratios), 4),
        "memory_ratio": round(median(mem_ratios), 4),
        "time_goal": GOAL,
        "time_ratio_of_medians": round(med[names[0]]["seconds"] / med[names[1]]["seconds"], 4),
        "time_ratio_per_repetition": [round(x, 4) for x in ratios],
        "median_step_seconds": {k: round(v["seconds"], 4) for k, v in med.items()},
        "median_peak_mb": {k: round(v["peak_mb"], 1) for k, v in med.items()},
        "repeats": repeats,
        "batch_rows": batch,
        "tokens_first_batch": tokens,
        "model": f"tiny qwen3 random-init, hidden {hidden}, {layers} layers, vocab {len(tokenizer)}",
        "memory_method": memory_method(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    table = [(k, f"{v['seconds']:.3f}", f"{v['peak_mb']:.0f}") for k, v in med.items()]
    table.append(("ratio echo / sft (median of paired)", f"{out['time_ratio']:.3f}", f"{out['memory_ratio']:.3f}"))
    print(
        f"offline ECHO step vs TRL SFTTrainer step, same tokens ({out['model']}; {batch} trajectories/step, "
        f"~{tokens} tokens; median of {repeats}, alternating)"
    )
    print(f"memory: {out['memory_method']}")
    report(table, ("trainer", "step s", "peak MiB"), out, args)
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
