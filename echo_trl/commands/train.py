"""``echo-trl train``: ECHO training the TRL way; with no arguments, a CPU demo.

    echo-trl train --model_name_or_path Qwen/Qwen3-0.6B --dataset_name DATASET --output_dir OUT \
        [--config recipe.yaml] [--world_model_coeff 0.05] [--use_peft] [any EchoGRPOConfig / ModelConfig flag]

    echo-trl train                     # the demo: bundled AWM episodes, a tiny local model, ECHO vs GRPO
    echo-trl train --demo [--output_dir DIR] [--data_dir DIR] [--max_steps N] ...
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EchoTrlError

REPO_DATA = Path(__file__).resolve().parents[2] / "data" / "episodes"
SHARED_EPISODES = Path(__file__).resolve().parents[3] / "shared" / "data" / "awm_episodes"
DEFAULT_CACHE = Path(os.environ.get("ECHO_TRL_CACHE", Path.home() / ".cache" / "echo_trl"))

DESCRIPTION = """\
Train a model with ECHO: GRPO on the agent's action tokens plus world_model_coeff x cross-entropy
on the environment's output tokens, from the same forward pass (EchoGRPOTrainer, a TRL GRPOTrainer).

Offline (this command): --dataset_name is a trajectory dataset (a directory written by
`echo-trl build-dataset`, or a Hub dataset id with that schema). Advantages come from the recorded
rewards, grouped by group_id; no generation. Every EchoGRPOConfig (TRL GRPOConfig +
ECHO), ModelConfig (--use_peft, --lora_r, ...) and script flag below is accepted, on the command line
or in --config YAML. The run ends with save_state() and save_model() in --output_dir.
With --eval_strategy steps, --eval_dataset_name (or --dataset_test_split) is evaluated and
eval_world/ce_env (held-out env-token cross-entropy, nats/token) is logged. Offline, num_generations
plays no role (groups come from group_id), but TRL still requires the generation batch
(per_device_train_batch_size x processes x steps_per_generation) to be a multiple of it.

With NO arguments (or --demo) it runs a CPU demo instead: the AWM episodes bundled in data/episodes
(or a synthetic AWM-style set), a tiny model built locally (no downloads), ECHO and a lambda=0
GRPO baseline on the same data, both from the same checkpoint: the tiny model after a short shared
warm-up on the train split's context + action tokens (env outputs removed; a stand-in for pretraining,
cached with the tiny model; --warmup_steps 0 skips it); it prints held-out env CE before/after for both and writes the
models, metrics.json and env_ce.png to the output dir. `echo-trl train --demo --help` lists its options.
"""


@dataclass
class EchoScriptArguments:
    """Script arguments of ``echo-trl train`` (TRL's names)."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Trajectory dataset: a local `echo-trl build-dataset` directory or a Hub id."})
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str = field(
        default="test", metadata={"help": "Held-out split for evaluation (used when --eval_strategy is not 'no')."})
    eval_dataset_name: str | None = field(
        default=None, metadata={"help": "Held-out trajectory dataset (directory or Hub id) for evaluation; default: "
                                "--dataset_test_split of --dataset_name."})


def make_parser():
    from trl import ModelConfig, TrlParser

    from ..config import EchoGRPOConfig

    usage = ("echo-trl train [--config YAML] --model_name_or_path MODEL --dataset_name DATASET --output_dir DIR "
             "[FLAGS...]\n       echo-trl train                  # no arguments: the CPU demo (ECHO vs GRPO)\n"
             "       echo-trl train --demo --help    # the demo's options")
    # allow_abbrev=False: `--max_step 3` must not silently become --max_steps (HfArgumentParser passes it on
    # to argparse and already accepts --max-steps for --max_steps)
    return TrlParser((EchoScriptArguments, EchoGRPOConfig, ModelConfig), prog="echo-trl train", usage=usage,
                     description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                     allow_abbrev=False)


def main(argv: list[str]) -> int:
    argv = list(argv)
    if not argv or argv[0] == "--demo":
        return run_demo(parse_demo_args(argv[1:] if argv else []))
    from ..loading import check_config_file

    check_config_file(argv)
    parser = make_parser()
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as exc:  # TrainingArguments / GRPOConfig validation: a usage error, not a crash
        if "not used by the HfArgumentParser" in str(exc):
            unknown = str(exc).split(":", 1)[1].strip(" []").replace("'", "").replace(",", "")
            raise EchoTrlError(f"unrecognized arguments: {unknown} (`echo-trl train --help` lists every flag; "
                               "flags are never abbreviated)") from None
        hint = (" (on a machine without a GPU pass --use_cpu; `echo-trl train` with no arguments runs the CPU demo)"
                if "use_cpu" in str(exc) else "")
        raise EchoTrlError(f"invalid training arguments: {' '.join(str(exc).split())}{hint}") from exc
    return run_training(script_args, training_args, model_args)


def check_completion_room(tokenizer, dataset, limit: int | None, name: str) -> None:
    """Every trajectory keeps at least one completion message under ``max_completion_length``.

    Completions are cut at message ends, so a limit shorter than a row's first message leaves that row
    with no completion token at all: it would train nothing, and a batch of such rows makes an empty
    completion that TRL's loss cannot take (a tensor-size RuntimeError deep in the step).
    """
    from ..tokenization import tokenize_batch

    if limit is None:
        return
    if limit < 1:
        raise EchoTrlError(f"--max_completion_length {limit}: expected a positive number of tokens")
    firsts = []
    for start in range(0, len(dataset), 256):
        for t in tokenize_batch(tokenizer, list(dataset.select(range(start, min(start + 256, len(dataset)))))):
            firsts.append(t.message_token_spans[0][1] - t.prompt_length if t.message_token_spans else 0)
    empty = [n for n in firsts if n > limit]
    if empty:
        raise EchoTrlError(
            f"--max_completion_length {limit} keeps no completion token of {len(empty)} of {len(firsts)} trajectories "
            f"in {name} (completions are cut at message ends and their first message alone has {min(empty)}-"
            f"{max(empty)} tokens): use at least {max(firsts)}")


def run_training(script_args: EchoScriptArguments, training_args, model_args) -> int:
    from trl import get_peft_config, get_quantization_config

    from ..loading import load_tokenizer, locate, resolve_checkpoint
    from ..trainer import EchoGRPOTrainer

    if not model_args.model_name_or_path:
        raise EchoTrlError("--model_name_or_path is required (run `echo-trl train` with no arguments for the demo)")
    if not script_args.dataset_name:
        raise EchoTrlError("--dataset_name is required: a trajectory dataset directory or Hub id "
                           "(build one with `echo-trl build-dataset`)")
    evaluating = training_args.eval_strategy != "no"
    for name, what in ((model_args.model_name_or_path, "--model_name_or_path"), (script_args.dataset_name,
                       "--dataset_name"), (script_args.eval_dataset_name if evaluating else None, "--eval_dataset_name")):
        if name:
            locate(name, what)  # every name checked before anything slow is loaded
    checkpoint = resolve_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    train_dataset = _load_split(script_args.dataset_name, script_args.dataset_train_split)
    eval_dataset = None
    if evaluating:
        if script_args.eval_dataset_name:
            eval_dataset = _load_split(script_args.eval_dataset_name, script_args.dataset_test_split)
        elif (Path(script_args.dataset_name) / "dataset_info.json").exists():
            raise EchoTrlError(f"{script_args.dataset_name} is a single-split dataset directory: pass the held-out "
                               "trajectories with --eval_dataset_name DIR")
        else:
            eval_dataset = _load_split(script_args.dataset_name, script_args.dataset_test_split)
    # the trainer loads its own (left-padded) copy; this one only measures the first completion messages
    tokenizer = load_tokenizer(model_args.model_name_or_path, trust_remote_code=training_args.trust_remote_code)
    for ds, name in ((train_dataset, script_args.dataset_name), (eval_dataset, "the eval dataset")):
        if ds is not None:
            check_completion_room(tokenizer, ds, training_args.max_completion_length, name)
    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    trainer = EchoGRPOTrainer(
        model=model_args.model_name_or_path, args=training_args, train_dataset=train_dataset,
        eval_dataset=eval_dataset, quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args))
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_state()
    trainer.save_model(training_args.output_dir)
    final = [h for h in trainer.state.log_history if "eval_world/ce_env" in h]
    if final:
        trainer.accelerator.print(f"held-out env CE: {final[-1]['eval_world/ce_env']:.4f} nats/token")
    trainer.accelerator.print(f"model and trainer_state.json saved to {training_args.output_dir}")
    return 0


def _load_split(name: str, split: str):
    from ..loading import load_dataset_named

    try:
        return load_dataset_named(name, split=split)
    except (KeyError, ValueError) as exc:
        if "split" in str(exc).lower() or isinstance(exc, KeyError):
            raise EchoTrlError(f"{name}: no split {split!r} ({exc})") from None
        raise


# --------------------------------------------------------------------------------------------
# Synthetic AWM-style episodes (demo fallback when no bundled episodes exist)

_CATALOG_WORDS = {
    "headphones": ["Sony WH-1000", "Bose QC 45", "Anker Soundcore", "JBL Tune 760", "Sennheiser HD 450"],
    "keyboards": ["Logitech MX Keys", "Keychron K2", "Razer BlackWidow", "Corsair K70", "Apple Magic Keyboard"],
    "monitors": ["Dell U2723", "LG 27GP850", "Samsung Odyssey G5", "ASUS ProArt", "BenQ PD2700"],
    "backpacks": ["Osprey Daylite", "Herschel Little America", "North Face Borealis", "Peak Design Everyday",
                  "Timbuk2 Authority"],
}


def _catalog(seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    rng = random.Random(seed)
    catalog, pid = {}, 1
    for category, titles in _CATALOG_WORDS.items():
        items = []
        for title in titles:
            items.append({"id": pid, "title": title, "category": category,
                          "price": round(rng.uniform(20, 400), 2), "average_rating": round(rng.uniform(3.0, 5.0), 1),
                          "review_count": rng.randint(10, 5000), "in_stock": rng.random() > 0.15})
            pid += 1
        catalog[category] = items
    return catalog


def synthetic_episodes(n_tasks: int = 24, per_task: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    """AWM-style episodes (OpenEnv capture shape) of a small, deterministic shop environment.

    Each task asks for the best-rated product of a category under a budget; the agent searches,
    inspects one product, adds it to the cart and verifies. Environment outputs are a fixed
    function of the actions (a world model can learn them); rewards differ within a task (the
    agent sometimes picks the wrong product), so GRPO groups have non-zero advantages.
    """
    rng = random.Random(seed)
    catalog = _catalog(seed)
    episodes = []
    for t in range(n_tasks):
        category = list(catalog)[t % len(catalog)]
        budget = [100, 150, 200, 250, 300, 350][(t // len(catalog)) % 6]
        items = catalog[category]
        eligible = [p for p in items if p["price"] <= budget and p["in_stock"]]
        best = max(eligible, key=lambda p: p["average_rating"]) if eligible else None
        task = (f"Find the best-rated {category[:-1]} that is in stock and costs at most ${budget}, "
                f"and add one to my cart.")
        for _ in range(per_task):
            pick = best if best is not None and rng.random() < 0.5 else rng.choice(items)
            limit = rng.choice([3, 5])
            listed = sorted(items, key=lambda p: -p["average_rating"])[:limit]
            steps = [
                {"action": {"tool_name": "search_products",
                            "arguments": {"query": category, "sort_by": "average_rating", "limit": limit}},
                 "observation": {"tool_result": {"products": listed, "total": len(items)},
                                 "reward_type": "tool_call_ok", "done": False}},
                {"action": {"tool_name": "get_product_by_id", "arguments": {"product_id": pick["id"]}},
                 "observation": {"tool_result": {"product": pick, "offers": [
                     {"seller": "shop", "price": pick["price"], "currency": "USD", "in_stock": pick["in_stock"]}]},
                     "reward_type": "tool_call_ok", "done": False}},
            ]
            if pick["in_stock"]:
                cart = {"cart_id": 1, "items": [{"product_id": pick["id"], "title": pick["title"], "quantity": 1,
                                                  "unit_price": pick["price"]}], "subtotal": pick["price"]}
                steps.append({"action": {"tool_name": "add_item_to_cart",
                                         "arguments": {"product_id": pick["id"], "quantity": 1}},
                              "observation": {"tool_result": cart, "reward_type": "tool_call_ok", "done": False}})
            else:
                steps.append({"action": {"tool_name": "add_item_to_cart",
                                         "arguments": {"product_id": pick["id"], "quantity": 1}},
                              "observation": {"error": f"Error: product {pick['id']} is out of stock",
                                              "reward_type": "tool_call_error", "done": False}})
            correct = best is not None and pick["id"] == best["id"]
            steps.append({"action": {"tool_name": "verify", "arguments": {}},
                          "observation": {"verify_result": {"result": "complete" if correct else "incomplete"},
                                          "reward_type": "complete" if correct else "incomplete", "done": True}})
            episodes.append({"scenario": f"shop_{category}", "task": task, "task_idx": t,
                             "tools": ["search_products", "get_product_by_id", "add_item_to_cart", "verify"],
                             "steps": steps, "reward": 1.0 if correct else 0.1})
    return episodes


def write_episodes(episodes: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for ep in episodes:
            fh.write(json.dumps(ep) + "\n")
    return path




# --------------------------------------------------------------------------------------------
# The demo


def parse_demo_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="echo-trl train --demo",
        description="CPU demo: ECHO vs a lambda=0 GRPO baseline on the same AWM episodes, tiny local model. "
                    "Prints held-out env-token CE before/after for both; writes models, metrics.json and env_ce.png.")
    p.add_argument("--output_dir", default="outputs/echo-demo", help="where models, metrics.json and env_ce.png go")
    p.add_argument("--data_dir", default=None,
                   help=f"AWM episode files/dirs (default: {REPO_DATA} when it holds episodes, else a synthetic "
                        "AWM-style set written to OUTPUT_DIR/episodes)")
    p.add_argument("--max_steps", type=int, default=20, help="optimizer steps per run")
    p.add_argument("--world_model_coeff", type=float, default=0.05, help="lambda of the ECHO run")
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--per_device_train_batch_size", type=int, default=4)
    p.add_argument("--eval_steps", type=int, default=5, help="held-out env CE every this many steps (the plot)")
    p.add_argument("--max_episodes", type=int, default=96, help="use at most this many episodes (bundled data)")
    p.add_argument("--max_completion_length", type=int, default=2048, help="completion tokens kept per trajectory")
    p.add_argument("--keep_tool_schemas", action="store_true",
                   help="keep the full tool schemas in the prompt (AWM's are ~10k tokens: slow on CPU); by default "
                        "only the tool names are rendered")
    p.add_argument("--model_cache_dir", default=str(DEFAULT_CACHE),
                   help="where the tiny model is built once and reused ($ECHO_TRL_CACHE)")
    p.add_argument("--warmup_steps", type=int, default=40,
                   help="shared warm-up of the random-init tiny model before both runs (stands in for pretraining): "
                        "next-token training on the train split's context + action tokens, env outputs removed; "
                        "cached next to the tiny model; 0 = start from random init")
    p.add_argument("--warmup_learning_rate", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _demo_episode_files(args: argparse.Namespace, out: Path) -> tuple[list[Path], str, Path | None]:
    """Episode files, a description of where they come from, and a ``splits.json`` if one goes with them."""
    from ..awm import find_episode_files

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
    path = write_episodes(synthetic_episodes(n_tasks=24, per_task=4, seed=args.seed), out / "episodes" / "synthetic.jsonl")
    return [path], "synthetic AWM-style episodes (no bundled data/episodes found)", None


def _split(ds, splits: Path | None, held_every: int = 4):
    """Train / held-out by task: ``splits.json`` ({scenario: {"held_out": [task_idx, ...]}}) when given,
    else every ``held_every``-th task group."""
    if splits is not None:
        spec = json.loads(splits.read_text(encoding="utf-8"))
        held = {f"{scenario}/{k}" for scenario, s in spec.items() for k in s.get("held_out", [])}
    else:
        groups = sorted(set(ds["group_id"]))
        held = set(groups[held_every - 1::held_every]) or {groups[-1]}
    return ds.filter(lambda r: r["group_id"] not in held), ds.filter(lambda r: r["group_id"] in held)


def _names_only_tools(ds):
    """Replace full tool schemas by bare names: AWM's MCP descriptions are ~10k tokens per prompt, too long
    for a CPU demo (the names keep the template's tool-calling section and the filters' tool list)."""
    from ..awm import tool_schema

    def strip(row):
        return {"tools": [json.dumps(tool_schema(json.loads(t)["function"]["name"])) for t in row["tools"]]}

    return ds.map(strip)


def _tiny_model_for(ds, cache_dir: Path) -> Path:
    from ..tiny import ensure_tiny_model

    corpus = []
    for row in ds:
        corpus += [m["content"] or "" for m in row["prompt"] + row["completion"]]
        corpus += [c["function"]["arguments"] + c["function"]["name"] for m in row["completion"]
                   for c in (m["tool_calls"] or [])]
    digest = hashlib.sha256("\x00".join(corpus).encode()).hexdigest()[:12]
    return ensure_tiny_model(cache_dir / f"tiny-qwen3-{digest}", family="qwen3", corpus=corpus)


def _train_run(name: str, coeff: float, model_path: Path, train, held, args, out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from ..config import EchoGRPOConfig
    from ..trainer import EchoGRPOTrainer
    from ..world_eval import evaluate_world_model

    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    before = evaluate_world_model(model, tokenizer, held, max_completion_length=args.max_completion_length)
    config = EchoGRPOConfig(
        output_dir=str(out / name), world_model_coeff=coeff, max_steps=args.max_steps,
        learning_rate=args.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        per_device_train_batch_size=args.per_device_train_batch_size, per_device_eval_batch_size=2,
        num_generations=2, max_completion_length=args.max_completion_length, gradient_checkpointing=False,
        use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no", seed=args.seed,
        eval_strategy="steps", eval_steps=args.eval_steps, disable_tqdm=True)
    trainer = EchoGRPOTrainer(model, args=config, train_dataset=train, eval_dataset=held, processing_class=tokenizer)
    trainer.remove_callback(PrinterCallback)  # the demo prints its own summary; the logs are in trainer_state.json
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    trainer.save_state()
    trainer.save_model(str(out / name))
    after = evaluate_world_model(trainer.model, tokenizer, held, max_completion_length=args.max_completion_length)
    curve = [(0, before["ce_env"])] + [(h["step"], h["eval_world/ce_env"]) for h in trainer.state.log_history
                                       if "eval_world/ce_env" in h]
    train_ce = [(h["step"], h["world/ce_env"]) for h in trainer.state.log_history if "world/ce_env" in h]
    return {"world_model_coeff": coeff, "heldout_ce_env_before": before["ce_env"],
            "heldout_ce_env_after": after["ce_env"], "heldout_tokens_env": after["tokens_env"],
            "by_scenario_after": after["by_scenario"], "eval_curve": curve, "train_ce_env": train_ce,
            "train_seconds": round(seconds, 1), "model_dir": str(out / name)}


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


def run_demo(args: argparse.Namespace) -> int:
    from ..dataset import build_awm_dataset
    from ..progress import quiet_libraries
    from ..warmup import WarmupSettings, warm_up_tiny_model

    quiet_libraries(progress_bars=True, user_warnings=True)
    start = time.time()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files, source, splits = _demo_episode_files(args, out)
    ds = build_awm_dataset(files, strict=False)
    if len(ds) > args.max_episodes:
        ds = ds.shuffle(seed=args.seed).select(range(args.max_episodes))
    if not args.keep_tool_schemas:
        ds = _names_only_tools(ds)
    if len(set(ds["group_id"])) < 2 or len(ds) < 2 * args.per_device_train_batch_size:
        raise EchoTrlError(f"{source}: {len(ds)} episodes in {len(set(ds['group_id']))} task group(s) are too few for "
                           "a train / held-out split; pass --data_dir with more episodes")
    train, held = _split(ds, splits)
    if len(train) < args.per_device_train_batch_size or not len(held):
        raise EchoTrlError(f"{source}: the split leaves {len(train)} train / {len(held)} held-out episodes")
    print(f"echo-trl demo: {len(train)} train / {len(held)} held-out episodes from {source}", file=sys.stderr)
    model_path = _tiny_model_for(train, Path(args.model_cache_dir))
    print(f"tiny model: {model_path}", file=sys.stderr)
    model_path, warmup = warm_up_tiny_model(
        model_path, train, WarmupSettings(steps=args.warmup_steps, learning_rate=args.warmup_learning_rate,
                                          batch_size=args.per_device_train_batch_size,
                                          max_completion_length=args.max_completion_length, seed=args.seed),
        log=lambda m: print(m, file=sys.stderr))
    if args.warmup_steps > 0:
        print(f"warmed-up start model (shared by both runs{', cached' if warmup['cached'] else ''}): {model_path}",
              file=sys.stderr)

    labels = {f"ECHO (lambda={args.world_model_coeff:g})": ("echo", args.world_model_coeff),
              "GRPO (lambda=0)": ("grpo_baseline", 0.0)}
    results = {}
    for label, (name, coeff) in labels.items():
        print(f"training {label} for {args.max_steps} steps ...", file=sys.stderr)
        results[label] = _train_run(name, coeff, model_path, train, held, args, out)

    metrics = {"source": source, "train_episodes": len(train), "heldout_episodes": len(held),
               "heldout_groups": sorted(set(held["group_id"])), "split": str(splits) if splits else "every 4th task",
               "tool_schemas": "full" if args.keep_tool_schemas else "names only",
               "model": str(model_path), "warmup": warmup, "max_steps": args.max_steps, "learning_rate": args.learning_rate,
               "runs": results, "wall_seconds": round(time.time() - start, 1)}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    plot = _plot(results, out / "env_ce.png")

    start_model = (f"tiny Qwen3-architecture model after a shared {args.warmup_steps}-step warm-up on context + action "
                   "tokens (env outputs never shown)" if args.warmup_steps > 0 else "tiny random-init Qwen3-architecture model")
    print(f"\nECHO demo: {start_model}, {len(train)} train / {len(held)} held-out episodes ({source}), "
          f"{args.max_steps} steps each")
    print(f"{'held-out env-token CE (nats/token)':<36}{'before':>9}{'after':>9}{'change':>9}")
    for label, r in results.items():
        b, a = r["heldout_ce_env_before"], r["heldout_ce_env_after"]
        print(f"  {label:<34}{b:>9.3f}{a:>9.3f}{a - b:>+9.3f}")
    print(f"wrote {out / 'metrics.json'}" + (f", {plot}" if plot else "")
          + f", models in {out / 'echo'} and {out / 'grpo_baseline'} ({metrics['wall_seconds']:.0f}s)")
    return 0
