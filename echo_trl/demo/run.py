"""``echo-trl train`` with no arguments (or ``--demo``): ECHO vs a lambda = 0 GRPO baseline on CPU.

The AWM episodes bundled in ``data/episodes`` (or a synthetic AWM-style set), a tiny model built
locally (no downloads) and warmed up env-blind (:mod:`echo_trl.demo.warmup`), then two runs from that
same checkpoint; prints the held-out env CE before and after each and writes the models,
``metrics.json`` and ``env_ce.png``. It never overwrites a previous run's outputs unless told to.

Its options (:mod:`echo_trl.demo.options`) are ``EchoGRPOConfig`` fields where they mean the same thing, so
parsing them loads TRL's config; the data, model and training libraries load inside the functions that use them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import EchoTrlError
from .episodes import synthetic_episodes, write_episodes
from .options import REPO_DATA, DemoArguments, parse_demo_args
from .tiny import tiny_model_for

#: The runs of the comparison: output subdirectory per run.
RUN_DIRS = ("echo", "grpo_baseline")
#: The results a demo run writes into its output directory (a previous run's are never silently replaced).
OUTPUTS = ("metrics.json", "env_ce.png", *RUN_DIRS)


def main(argv: list[str]) -> int:
    return run_demo(parse_demo_args(argv))


def claim_output_dir(out: Path, overwrite: bool) -> None:
    """Refuse to write over a previous run's outputs unless ``overwrite`` (checked before any work starts)."""
    previous = [name for name in OUTPUTS if (out / name).exists()]
    if previous and not overwrite:
        raise EchoTrlError(
            f"{out} holds a previous demo run ({', '.join(previous)}): pass --overwrite_output_dir "
            "to replace it, or choose another --output_dir"
        )
    out.mkdir(parents=True, exist_ok=True)


def _demo_episode_files(args: DemoArguments, out: Path) -> tuple[list[Path], str, Path | None]:
    """Episode files, a description of where they come from, and a ``splits.json`` if one goes with them."""
    from ..data.readers.episode_files import find_episode_files

    if args.data_dir:
        files = find_episode_files([args.data_dir])
        if not files:
            raise EchoTrlError(f"no episode files (.json/.jsonl) under {args.data_dir}")
        splits = Path(args.data_dir) / "splits.json"
        return files, str(args.data_dir), splits if splits.is_file() else None
    if REPO_DATA.is_dir():
        files = find_episode_files([REPO_DATA])
        if files:
            splits = REPO_DATA.parent / "awm_scenarios" / "splits.json"
            return files, f"bundled {REPO_DATA}", splits if splits.is_file() else None
    path = write_episodes(
        synthetic_episodes(n_tasks=24, per_task=4, seed=args.seed), out / "episodes" / "synthetic.jsonl"
    )
    return [path], "synthetic AWM-style episodes (no bundled data/episodes found)", None


def split_by_task(ds, splits: Path | None, held_every: int = 4):
    """Train / held-out by task: ``splits.json`` ({scenario: {"held_out": [task_idx, ...]}}) when given,
    else every ``held_every``-th task group."""
    if splits is not None:
        spec = json.loads(splits.read_text(encoding="utf-8"))
        held = {f"{scenario}/{k}" for scenario, s in spec.items() for k in s.get("held_out", [])}
    else:
        groups = sorted(set(ds["group_id"]))
        held = set(groups[held_every - 1 :: held_every]) or {groups[-1]}
    return ds.filter(lambda r: r["group_id"] not in held), ds.filter(lambda r: r["group_id"] in held)


def names_only_tools(ds):
    """Replace full tool schemas by bare names: AWM's MCP descriptions are ~10k tokens per prompt, too long
    for a CPU demo (the names keep the template's tool-calling section and the filters' tool list)."""
    from ..data.readers.tools import tool_schema

    def strip(row):
        return {"tools": [json.dumps(tool_schema(json.loads(t)["function"]["name"])) for t in row["tools"]]}

    return ds.map(strip)


def _train_run(
    name: str, coeff: float, model_path: Path, train, held, args: DemoArguments, out: Path
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from ..progress import training_progress
    from ..train.world_eval import evaluate_world_model
    from ..trainer import EchoGRPOTrainer

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    before = evaluate_world_model(model, tokenizer, held, max_completion_length=args.max_completion_length)
    config = args.run_config(out / name, world_model_coeff=coeff)
    trainer = EchoGRPOTrainer(model, args=config, train_dataset=train, eval_dataset=held, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # the demo prints its own summary; the logs are in trainer_state.json
    trainer.add_callback(training_progress(f"train {name}"))  # steps, ETA and the last held-out CE on a terminal
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    trainer.save_state()
    trainer.save_model(str(out / name))
    after = evaluate_world_model(trainer.model, tokenizer, held, max_completion_length=args.max_completion_length)
    curve = [(0, before["ce_env"])] + [
        (h["step"], h["eval_world/ce_env"]) for h in trainer.state.log_history if "eval_world/ce_env" in h
    ]
    train_ce = [(h["step"], h["world/ce_env"]) for h in trainer.state.log_history if "world/ce_env" in h]
    return {
        "world_model_coeff": coeff,
        "heldout_ce_env_before": before["ce_env"],
        "heldout_ce_env_after": after["ce_env"],
        "heldout_tokens_env": after["tokens_env"],
        "by_scenario_after": after["by_scenario"],
        "eval_curve": curve,
        "train_ce_env": train_ce,
        "train_seconds": round(seconds, 1),
        "model_dir": str(out / name),
    }


def _plot(results: dict[str, dict[str, Any]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the [plot] extra
        print("matplotlib not installed (pip install 'echo-trl[plot]'): no plot written", file=sys.stderr)
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, r in results.items():
        steps, ce = zip(*r["eval_curve"], strict=True)
        ax.plot(steps, ce, marker="o", label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out env-token CE (nats/token)")
    ax.set_title("World-model metric: ECHO vs GRPO")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_demo(args: DemoArguments) -> int:
    """The comparison, with torch's CPU threads at ``--threads`` for its duration."""
    from ..progress import quiet_libraries
    from .warmup import torch_threads

    quiet_libraries(progress_bars=True, user_warnings=True)
    if args.threads < 1:
        raise EchoTrlError(f"--threads {args.threads}: must be at least 1")
    with torch_threads(args.threads):
        return _run_demo(args)


def _run_demo(args: DemoArguments) -> int:
    from ..data.build import build_awm_dataset
    from ..data.cache_dir import cache_home
    from .warmup import warm_up_tiny_model

    start = time.time()
    out = Path(args.output_dir)
    claim_output_dir(out, args.overwrite_output_dir)
    files, source, splits = _demo_episode_files(args, out)
    ds = build_awm_dataset(files, strict=False)
    if len(ds) > args.max_episodes:
        ds = ds.shuffle(seed=args.seed).select(range(args.max_episodes))
    if not args.keep_tool_schemas:
        ds = names_only_tools(ds)
    if len(set(ds["group_id"])) < 2 or len(ds) < 2 * args.per_device_train_batch_size:
        raise EchoTrlError(
            f"{source}: {len(ds)} episodes in {len(set(ds['group_id']))} task group(s) are too few for "
            "a train / held-out split; pass --data_dir with more episodes"
        )
    train, held = split_by_task(ds, splits)
    if len(train) < args.per_device_train_batch_size or not len(held):
        raise EchoTrlError(f"{source}: the split leaves {len(train)} train / {len(held)} held-out episodes")
    print(f"echo-trl demo: {len(train)} train / {len(held)} held-out episodes from {source}", file=sys.stderr)
    model_path = tiny_model_for(train, Path(args.model_cache_dir) if args.model_cache_dir else cache_home())
    print(f"tiny model: {model_path}", file=sys.stderr)
    model_path, warmup = warm_up_tiny_model(
        model_path,
        train,
        args.warmup_settings(),
        log=lambda m: print(m, file=sys.stderr),
    )
    if args.warmup_steps > 0:
        print(
            f"warmed-up start model (shared by both runs{', cached' if warmup['cached'] else ''}): {model_path}",
            file=sys.stderr,
        )

    labels = {
        f"ECHO (lambda={args.world_model_coeff:g})": (RUN_DIRS[0], args.world_model_coeff),
        "GRPO (lambda=0)": (RUN_DIRS[1], 0.0),
    }
    results = {}
    for label, (name, coeff) in labels.items():
        print(f"training {label} for {args.max_steps} steps ...", file=sys.stderr)
        results[label] = _train_run(name, coeff, model_path, train, held, args, out)

    metrics = {
        "source": source,
        "train_episodes": len(train),
        "heldout_episodes": len(held),
        "heldout_groups": sorted(set(held["group_id"])),
        "split": str(splits) if splits else "every 4th task",
        "tool_schemas": "full" if args.keep_tool_schemas else "names only",
        "model": str(model_path),
        "warmup": warmup,
        "max_steps": args.max_steps,
        "learning_rate": args.learning_rate,
        "threads": args.threads,
        "runs": results,
        "wall_seconds": round(time.time() - start, 1),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    plot = _plot(results, out / "env_ce.png")

    start_model = (
        f"tiny Qwen3-architecture model after a shared {args.warmup_steps}-step warm-up on context + action "
        "tokens (env outputs never shown)"
        if args.warmup_steps > 0
        else "tiny random-init Qwen3-architecture model"
    )
    print(
        f"\nECHO demo: {start_model}, {len(train)} train / {len(held)} held-out episodes ({source}), "
        f"{args.max_steps} steps each"
    )
    print(f"{'held-out env-token CE (nats/token)':<36}{'before':>9}{'after':>9}{'change':>9}")
    for label, r in results.items():
        b, a = r["heldout_ce_env_before"], r["heldout_ce_env_after"]
        print(f"  {label:<34}{b:>9.3f}{a:>9.3f}{a - b:>+9.3f}")
    print(
        f"wrote {out / 'metrics.json'}"
        + (f", {plot}" if plot else "")
        + f", models in {out / RUN_DIRS[0]} and {out / RUN_DIRS[1]} ({metrics['wall_seconds']:.0f}s)"
    )
    return 0
