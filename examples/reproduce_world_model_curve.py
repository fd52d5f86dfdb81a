"""Paper Fig. 3 in miniature: held-out env-token CE under ECHO, GRPO (lambda = 0) and verifier-free ECHO,
plus a lambda sweep with final env CE and policy loss.

On the bundled AWM episodes (``data/episodes``: scenario ``library_1``, tasks 0-7 train, 8-9 held out
as in ``data/awm_scenarios/splits.json``) it trains, offline, from the same start model and with identical
settings except:

* ``echo``           lambda = 0.05 (GRPO on action tokens + lambda x CE on env-output tokens);
* ``grpo``           lambda = 0 (plain GRPO: the same trainer, world term off);
* ``verifier_free``  every reward zeroed and ``use_policy_loss=False`` (only the world term trains);
* the sweep          lambda in {0, 0.005, 0.02, 0.05, 0.2} (0 and 0.05 are the runs above).

Start model: a real model (``--model_name_or_path``) as given; by default a tiny random-init model after a
short shared warm-up (``echo_trl.demo.warmup``, ``--warmup_steps``): next-token training on the train split's
context + action tokens with every env output removed, standing in for pretraining. Without it, plain
GRPO on action tokens would itself lower env CE by teaching a random-init model generic token statistics,
which a pretrained model would not gain.

Every ``--eval_every`` optimizer steps (and at step 0) it measures, on the held-out episodes and
independently of the trainer (``echo_trl.train.world_eval.evaluate_world_model``: teacher-forced, nats per
env-output token), the env-token CE, and the held-out action-token CE (how well the policy still
predicts the recorded agent turns). Writes under ``--output_dir``: ``curves.png`` (the three
curves), ``lambda_sweep.png`` (final env CE and policy loss per lambda, collapse flagged) and
``results.json`` (every number).

Collapse: offline, the agent's actions are recorded, so the paper's collapse (dull commands whose output is easy
to predict) cannot happen here. The sweep flags its precursors instead: a lambda whose held-out action CE (mean
over the last quarter of the run) is more than ``--collapse_tol`` (relative) above lambda = 0's, or whose mean
policy entropy falls below half of lambda = 0's; every lambda above 0.1 (where the paper saw collapse) is marked.
The GRPO policy loss says little offline: with ``--behavior_policy current`` every update is the batch's first
(ratio 1), so its value is minus the mean advantage for every lambda; with ``initial`` the ratio departs from 1
as training moves and clipping bounds the drift (``mean_clip_ratio`` in results.json).

    python examples/reproduce_world_model_curve.py            # tiny local model, CPU, minutes
    python examples/reproduce_world_model_curve.py --quick    # smaller and shorter
    python examples/reproduce_world_model_curve.py --model_name_or_path Qwen/Qwen3-0.6B --learning_rate 1e-6  # GPU
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAIN = {"echo": "ECHO (lambda=0.05)", "grpo": "GRPO (lambda=0)", "verifier_free": "verifier-free ECHO"}
SWEEP = (0.0, 0.005, 0.02, 0.05, 0.2)


def parse_args(argv=None) -> argparse.Namespace:
    from echo_trl.demo.warmup import add_warmup_arguments

    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="fewer steps (about 8 CPU minutes)")
    p.add_argument("--output_dir", default="outputs/world_model_curve")
    p.add_argument("--data_dir", default=str(REPO / "data" / "episodes"))
    p.add_argument("--splits", default=str(REPO / "data" / "awm_scenarios" / "splits.json"))
    p.add_argument("--model_name_or_path", help="a real model (GPU); default: a tiny random-init Qwen3 model, local")
    p.add_argument("--max_steps", type=int, default=None, help="optimizer steps per run (default 60, quick 20)")
    p.add_argument("--eval_every", type=int, default=None, help="held-out eval every N optimizer steps (default 5)")
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--world_model_coeff", type=float, default=0.05, help="lambda of the ECHO and verifier-free runs")
    p.add_argument("--sweep", type=float, nargs="*", default=list(SWEEP), help="lambdas of the sweep")
    p.add_argument("--per_device_train_batch_size", type=int, default=4)
    p.add_argument("--max_completion_length", type=int, default=None, help="completion tokens kept (default: all)")
    p.add_argument("--hidden_size", type=int, default=None, help="tiny model width (default 128)")
    p.add_argument(
        "--keep_tool_schemas",
        action="store_true",
        help="keep the 21 tool schemas in the prompt (~4.6k context tokens per episode); by default they "
        "are dropped for the tiny-model CPU run (context only: no env-output or action token changes), "
        "which cuts sequences to ~1.5k tokens. Always kept with --model_name_or_path.",
    )
    add_warmup_arguments(p, before="every run (tiny model only)")
    p.add_argument("--collapse_tol", type=float, default=0.10)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1)")
    behavior = (
        "behaviour policy of the recorded episodes: the starting model or the current one (default: the config's)"
    )
    p.add_argument("--behavior_policy", choices=["initial", "current"], help=behavior)
    p.add_argument("--seed", type=int, default=0)
    copy = "also copy the two PNGs into this directory (docs/img); with --behavior_policy current, as *_current"
    p.add_argument("--copy_to_docs", help=copy)
    args = p.parse_args(argv)
    args.max_steps = args.max_steps or (20 if args.quick else 60)
    args.eval_every = args.eval_every or 5
    # quick keeps the width: after the warm-up a 64-wide model is left over-confident on action tokens and
    # lambda = 0 then lowers env CE by "un-learning" that; 128 wide it does not.
    args.hidden_size = args.hidden_size or 128
    return args


def quiet() -> None:
    from echo_trl.progress import quiet_libraries

    quiet_libraries()


def load_data(args):
    from echo_trl.data.build import build_awm_dataset

    splits = json.loads(Path(args.splits).read_text())
    ds = build_awm_dataset([args.data_dir], compact_tools=True)
    train_idx = {(s, t) for s, v in splits.items() for t in v["train"]}
    held_idx = {(s, t) for s, v in splits.items() for t in v["held_out"]}
    if not args.keep_tool_schemas and not args.model_name_or_path:
        ds = ds.map(lambda r: {"tools": []})
    train = ds.filter(lambda r: (r["scenario"], r["task_idx"]) in train_idx)
    held = ds.filter(lambda r: (r["scenario"], r["task_idx"]) in held_idx)
    return train, held


def model_source(args, train) -> tuple[str, bool, dict | None]:
    """The start model of every run: a real model as given, else the tiny model after the shared warm-up."""
    if args.model_name_or_path:
        return args.model_name_or_path, False, None
    from echo_trl.demo.tiny import corpus_of, ensure_tiny_model
    from echo_trl.demo.warmup import WarmupSettings, warm_up_tiny_model

    corpus = list(corpus_of(train))  # the tokenizer sees training text only
    path = ensure_tiny_model(
        Path(args.output_dir) / f"tiny-qwen3-h{args.hidden_size}",
        family="qwen3",
        corpus=corpus,
        hidden_size=args.hidden_size,
    )
    warm, record = warm_up_tiny_model(
        path,
        train,
        WarmupSettings(
            steps=args.warmup_steps,
            learning_rate=args.warmup_learning_rate,
            batch_size=args.per_device_train_batch_size,
            max_completion_length=args.max_completion_length,
            seed=args.seed,
        ),
        log=lambda m: print(m, file=sys.stderr),
    )
    return str(warm), True, record


def action_ce(model, tokenizer, rows, max_completion_length=None) -> float:
    """Teacher-forced CE (nats/token) of the recorded agent (action) tokens of ``rows``."""
    import torch

    from echo_trl.roles import Role
    from echo_trl.tokens.tokenization import tokenize_with_roles

    was = model.training
    model.eval()
    nll, n = 0.0, 0
    try:
        with torch.no_grad():
            for row in rows:
                tokens = tokenize_with_roles(tokenizer, row)
                if max_completion_length is not None:
                    tokens = tokens.truncate(tokens.prompt_length + max_completion_length)
                ids = torch.tensor([tokens.input_ids], device=model.device)
                targets = torch.as_tensor(tokens.roles == Role.ACTION.code).nonzero().flatten()
                targets = targets[targets > 0]
                if targets.numel() == 0:
                    continue
                logits = model(input_ids=ids, logits_to_keep=(targets - 1).to(ids.device)).logits[0].float()
                lp = torch.log_softmax(logits, -1).gather(-1, ids[0, targets].unsqueeze(-1)).squeeze(-1)
                nll += float(-lp.sum())
                n += targets.numel()
    finally:
        model.train(was)
    return nll / max(n, 1)


def train_run(
    name: str, coeff: float, use_policy_loss: bool, zero_rewards: bool, source: str, train, held, args
) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from echo_trl.config import EchoGRPOConfig
    from echo_trl.train.world_eval import evaluate_world_model
    from echo_trl.trainer import EchoGRPOTrainer

    torch.manual_seed(args.seed)
    cuda = torch.cuda.is_available()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16 if cuda else torch.float32)
    if zero_rewards:
        train = train.map(lambda r: {"reward": 0.0})
    curve: list[dict] = []

    def evaluate(step: int, m) -> None:
        ev = evaluate_world_model(
            m, tokenizer, held, max_completion_length=args.max_completion_length, show_progress=False
        )
        curve.append(
            {
                "step": step,
                "heldout_ce_env": ev["ce_env"],
                "heldout_ce_action": action_ce(m, tokenizer, held, args.max_completion_length),
            }
        )

    class Eval(TrainerCallback):
        def on_step_end(self, a, state, control, model=None, **kw):
            if state.global_step % args.eval_every == 0 or state.global_step == state.max_steps:
                evaluate(state.global_step, model)

    evaluate(0, model)
    config = EchoGRPOConfig(
        output_dir=str(Path(args.output_dir) / "runs" / name),
        world_model_coeff=coeff,
        use_policy_loss=use_policy_loss,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=args.per_device_train_batch_size,
        num_generations=2,
        max_completion_length=args.max_completion_length,
        gradient_checkpointing=False,
        use_cpu=not cuda,
        bf16=cuda,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=args.seed,
        disable_tqdm=True,
        **({} if args.behavior_policy is None else {"behavior_policy": args.behavior_policy}),
    )
    trainer = EchoGRPOTrainer(model, args=config, train_dataset=train, processing_class=tokenizer, callbacks=[Eval()])
    trainer.remove_callback(PrinterCallback)
    t0 = time.time()
    trainer.train()
    seconds = time.time() - t0
    args.behavior_policy = config.behavior_policy  # recorded in results.json
    logs = [h for h in trainer.state.log_history if "world/loss_scaled" in h]
    steps = [
        {
            "step": h["step"],
            "loss": h.get("loss"),
            "world_loss_scaled": h["world/loss_scaled"],
            "world_loss_unscaled": h["world/loss_unscaled"],
            "train_ce_env": h.get("world/ce_env"),
            "entropy": h.get("entropy"),
            "clip_ratio": h.get("clip_ratio/region_mean"),
            "policy_loss": (h["loss"] - h["world/loss_scaled"])
            if use_policy_loss and h.get("loss") is not None
            else None,
        }
        for h in logs
    ]
    tail = steps[-max(1, len(steps) // 4) :]  # last quarter of the run: the "final" training values
    mean = lambda xs: (sum(xs) / len(xs)) if xs else None  # noqa: E731
    first, last = curve[0], curve[-1]
    return {
        "name": name,
        "world_model_coeff": coeff,
        "use_policy_loss": use_policy_loss,
        "zero_rewards": zero_rewards,
        "eval_curve": curve,
        "train_log": steps,
        "train_seconds": round(seconds, 1),
        "heldout_ce_env_start": first["heldout_ce_env"],
        "heldout_ce_env_end": last["heldout_ce_env"],
        "heldout_ce_env_rel_change": (last["heldout_ce_env"] - first["heldout_ce_env"]) / first["heldout_ce_env"],
        "heldout_ce_action_start": first["heldout_ce_action"],
        "heldout_ce_action_end": last["heldout_ce_action"],
        # the collapse check compares this, not one noisy end point: the mean over the last quarter of the run
        "heldout_ce_action_tail": mean(
            [c["heldout_ce_action"] for c in curve if c["step"] >= 0.75 * last["step"]] or [last["heldout_ce_action"]]
        ),
        "final_policy_loss": mean([s["policy_loss"] for s in tail if s["policy_loss"] is not None]),
        "final_entropy": mean([s["entropy"] for s in tail if s["entropy"] is not None]),
        "final_train_ce_env": mean([s["train_ce_env"] for s in tail if s["train_ce_env"] is not None]),
        "mean_clip_ratio": mean([s["clip_ratio"] for s in steps if s["clip_ratio"] is not None]),
    }


def flag_collapse(sweep: dict[str, dict], tol: float) -> None:
    base = sweep.get("0")
    for r in sweep.values():
        reasons = []
        if r["world_model_coeff"] > 0.1:
            reasons.append("lambda > 0.1 (paper: collapse at 0.2)")
        if base is not None and r is not base:
            if r["heldout_ce_action_tail"] > base["heldout_ce_action_tail"] * (1 + tol):
                reasons.append(
                    f"held-out action CE {r['heldout_ce_action_tail']:.3f} (last-quarter mean) > "
                    f"(1+{tol:g}) x lambda=0's {base['heldout_ce_action_tail']:.3f}"
                )
            if (
                r["final_entropy"] is not None
                and base["final_entropy"]
                and r["final_entropy"] < 0.5 * base["final_entropy"]
            ):
                reasons.append("policy entropy < half of lambda=0's")
        r["collapse_flag"] = bool(reasons)
        r["collapse_reasons"] = reasons


def plot(results: dict, out: Path) -> tuple[Path | None, Path | None]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install 'echo-trl[plot]'): no plots", file=sys.stderr)
        return None, None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for key, label in MAIN.items():
        r = results["runs"][key]
        ax.plot(
            [c["step"] for c in r["eval_curve"]],
            [c["heldout_ce_env"] for c in r["eval_curve"]],
            marker="o",
            label=f"{label}: {100 * r['heldout_ce_env_rel_change']:+.0f}%",
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out env-token CE (nats/token)")
    ax.set_title(
        f"World model on held-out AWM tasks\n({results['model_label']}, behavior_policy="
        f"{results['settings'].get('behavior_policy')})",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    curves = out / "curves.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)

    sweep = results["sweep"]
    keys = sorted(sweep, key=float)
    xs = list(range(len(keys)))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.8))
    env = [sweep[k]["heldout_ce_env_end"] for k in keys]
    pol = [sweep[k]["final_policy_loss"] if sweep[k]["final_policy_loss"] is not None else math.nan for k in keys]
    act = [sweep[k]["heldout_ce_action_tail"] for k in keys]
    colors = ["tab:red" if sweep[k]["collapse_flag"] else "tab:blue" for k in keys]
    a1.bar(xs, env, color=colors)
    a1.axhline(results["runs"]["grpo"]["heldout_ce_env_start"], color="gray", ls="--", lw=1, label="before training")
    a1.set_xticks(xs, keys)
    a1.set_xlabel("lambda")
    a1.set_ylabel("final held-out env CE (nats/token)")
    a1.legend(fontsize=8)
    a2.plot(xs, pol, marker="o", label="policy loss (last quarter, train)")
    a2b = a2.twinx()
    a2b.plot(xs, act, marker="s", color="tab:orange", label="held-out action CE (last quarter)")
    a2.set_xticks(xs, keys)
    a2.set_xlabel("lambda")
    a2.set_ylabel("GRPO policy loss")
    a2.ticklabel_format(axis="y", useOffset=False)  # offline it is one value for every lambda: show it flat
    finite = [p for p in pol if p == p]
    if finite and max(finite) - min(finite) < 1e-3:
        a2.set_ylim(min(finite) - 0.5, max(finite) + 0.5)
    a2b.set_ylabel("held-out action CE (nats/token)")
    for x, k in zip(xs, keys, strict=True):
        if sweep[k]["collapse_flag"]:
            a1.annotate("collapse risk", (x, env[x]), ha="center", va="bottom", fontsize=7, color="tab:red")
            a2b.annotate("!", (x, act[x]), ha="center", va="bottom", color="tab:red")
    h1, l1 = a2.get_legend_handles_labels()
    h2, l2 = a2b.get_legend_handles_labels()
    a2.legend(h1 + h2, l1 + l2, fontsize=7, loc="best")
    fig.suptitle("lambda sweep (red: collapse flagged)", fontsize=10)
    fig.tight_layout()
    sweep_png = out / "lambda_sweep.png"
    fig.savefig(sweep_png, dpi=120)
    plt.close(fig)
    return curves, sweep_png


def main(argv=None) -> dict:
    args = parse_args(argv)
    quiet()
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(args.threads or 1)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    train, held = load_data(args)
    source, tiny, warmup = model_source(args, train)
    label = (
        f"tiny Qwen3-arch h{args.hidden_size}"
        + (f", {args.warmup_steps}-step env-blind warm-up" if args.warmup_steps > 0 else ", random init")
        if tiny
        else Path(source).name
    )
    print(
        f"{len(train)} train / {len(held)} held-out episodes; model {source}; {args.max_steps} steps, "
        f"lr {args.learning_rate}",
        file=sys.stderr,
    )
    runs: dict[str, dict] = {}
    plan = [
        ("echo", args.world_model_coeff, True, False),
        ("grpo", 0.0, True, False),
        ("verifier_free", args.world_model_coeff, False, True),
    ]
    plan += [(f"lambda_{c:g}", c, True, False) for c in args.sweep if c not in (0.0, args.world_model_coeff)]
    for name, coeff, policy, zero in plan:
        print(f"run {name}: lambda={coeff:g} use_policy_loss={policy} zero_rewards={zero}", file=sys.stderr)
        runs[name] = train_run(name, coeff, policy, zero, source, train, held, args)
        r = runs[name]
        print(
            f"  held-out env CE {r['heldout_ce_env_start']:.3f} -> {r['heldout_ce_env_end']:.3f} "
            f"({100 * r['heldout_ce_env_rel_change']:+.1f}%), {r['train_seconds']}s",
            file=sys.stderr,
        )
    sweep = {}
    for c in args.sweep:
        key = "grpo" if c == 0.0 else "echo" if c == args.world_model_coeff else f"lambda_{c:g}"
        sweep[f"{c:g}"] = runs[key]
    flag_collapse(sweep, args.collapse_tol)
    echo, grpo = runs["echo"], runs["grpo"]
    acceptance = {
        "echo_rel_change": echo["heldout_ce_env_rel_change"],
        "grpo_rel_change": grpo["heldout_ce_env_rel_change"],
        "verifier_free_rel_change": runs["verifier_free"]["heldout_ce_env_rel_change"],
        "target": "ECHO lowers held-out env CE by >= 30% relative while lambda=0 moves it < 5%",
        "met": echo["heldout_ce_env_rel_change"] <= -0.30 and abs(grpo["heldout_ce_env_rel_change"]) < 0.05,
    }
    results = {
        "model": source,
        "model_label": label,
        "warmup": warmup,
        "train_episodes": len(train),
        "heldout_episodes": len(held),
        "settings": {k: v for k, v in vars(args).items()},
        "runs": runs,
        "sweep": {
            k: {
                kk: v[kk]
                for kk in (
                    "name",
                    "world_model_coeff",
                    "heldout_ce_env_start",
                    "heldout_ce_env_end",
                    "heldout_ce_env_rel_change",
                    "heldout_ce_action_end",
                    "heldout_ce_action_tail",
                    "final_policy_loss",
                    "final_entropy",
                    "mean_clip_ratio",
                    "collapse_flag",
                    "collapse_reasons",
                )
            }
            for k, v in sweep.items()
        },
        "acceptance": acceptance,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }
    curves, sweep_png = plot(results, out)
    results["wall_seconds"] = round(time.time() - start, 1)
    results["plots"] = [str(p) for p in (curves, sweep_png) if p]
    if args.copy_to_docs and curves:
        docs = Path(args.copy_to_docs)
        docs.mkdir(parents=True, exist_ok=True)
        suffix = "" if args.behavior_policy == "initial" else f"_{args.behavior_policy}"  # the default: no suffix
        for p, name in ((curves, f"world_model_curves{suffix}.png"), (sweep_png, f"lambda_sweep{suffix}.png")):
            shutil.copy(p, docs / name)
            results["plots"].append(str(docs / name))
    (out / "results.json").write_text(json.dumps(results, indent=2))

    print(f"\nheld-out env-token CE (nats/token), {label}, {args.max_steps} steps, lr {args.learning_rate}:")
    print(f"{'run':<28}{'step 0':>9}{'final':>9}{'change':>9}{'act CE':>9}{'policy':>9}  collapse")
    for key in [*MAIN, *[k for k in runs if k not in MAIN]]:
        r = runs[key]
        name = MAIN.get(key, f"lambda={r['world_model_coeff']:g}")
        flag = next((s["collapse_flag"] for s in results["sweep"].values() if s["name"] == key), None)
        pol = f"{r['final_policy_loss']:.4f}" if r["final_policy_loss"] is not None else "-"
        print(
            f"{name:<28}{r['heldout_ce_env_start']:>9.3f}{r['heldout_ce_env_end']:>9.3f}"
            f"{100 * r['heldout_ce_env_rel_change']:>+8.1f}%{r['heldout_ce_action_tail']:>9.3f}{pol:>9}  "
            f"{'' if flag is None else ('FLAGGED' if flag else 'no')}"
        )
    print("act CE: held-out action-token CE, mean over the last quarter of the run")
    print(f"acceptance ({acceptance['target']}): {'met' if acceptance['met'] else 'NOT met'}")
    print(
        f"wrote {out / 'results.json'}"
        + "".join(f", {p}" for p in results["plots"])
        + f" ({results['wall_seconds']:.0f}s)"
    )
    return results


if __name__ == "__main__":
    main()
