"""Online ECHO in the sandboxed terminal, on CPU, with a tiny local model.

1. Warm start (behaviour cloning on the *action* tokens of scripted training sessions only, so the
   model emits well-formed ``run`` tool calls; the env outputs are not trained here).
2. Online training with ``EchoGRPOTrainer(environment_factory=TerminalEnv)``: TRL samples
   completions, executes the ``run`` tool calls in a fresh sandboxed terminal per rollout, and
   ECHO adds lambda x CE on the tool outputs TRL appended (reward: fraction of commands that
   succeeded, ``TerminalEnv.get_reward``).
3. Held-out env CE before and after, teacher-forced on recorded sessions of held-out tasks whose
   command lines never appear in training (``trajectories.HELDOUT_TASKS``).

The lambda = 0 baseline (same warm start, same settings) runs too unless ``--no_baseline``.

    python -m examples.terminal.train_online [--max_steps 12] [--world_model_coeff 0.05] [--output_dir DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output_dir", default="outputs/terminal_online")
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--world_model_coeff", type=float, default=0.05)
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--warmup_steps", type=int, default=150, help="behaviour-cloning steps before online training")
    p.add_argument("--num_generations", type=int, default=4)
    p.add_argument("--max_completion_length", type=int, default=192)
    p.add_argument("--hidden_size", type=int, default=64)
    p.add_argument("--no_baseline", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def quiet():
    from echo_trl.progress import quiet_libraries

    quiet_libraries()


def build(args):
    from echo_trl.demo.tiny import build_tiny_model, build_tiny_tokenizer

    from .env import FILES
    from .trajectories import TRAIN_TASKS, trajectories

    train = trajectories(TRAIN_TASKS)
    corpus = list(FILES.values()) + [json.dumps([*t.prompt, *t.completion]) for t in train]
    tokenizer = build_tiny_tokenizer("qwen3", corpus, vocab_size=1024)
    model = build_tiny_model(
        tokenizer, "qwen3", hidden_size=args.hidden_size, num_layers=2, num_heads=4, seed=args.seed
    )
    return tokenizer, model, train


def warm_start(model, tokenizer, train, steps: int, lr: float = 3e-3, seed: int = 0) -> float:
    """Behaviour cloning on action tokens only (the world model is left untrained). Returns the last loss."""
    import torch

    from echo_trl.roles import Role
    from echo_trl.tokens.tokenization import tokenize_with_roles

    torch.manual_seed(seed)
    seqs = []
    for t in train:
        tok = tokenize_with_roles(tokenizer, t)
        ids = torch.tensor(tok.input_ids)
        labels = ids.clone()
        labels[torch.as_tensor(tok.roles != Role.ACTION.code)] = -100
        seqs.append((ids, labels))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        ids, labels = seqs[step % len(seqs)]
        loss = model(input_ids=ids[None], labels=labels[None]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return float(loss)


def heldout_ce(model, tokenizer) -> dict:
    from echo_trl.data.schema import trajectory_to_row
    from echo_trl.train.world_eval import evaluate_world_model

    from .trajectories import HELDOUT_TASKS, trajectories

    rows = [trajectory_to_row(t) for t in trajectories(HELDOUT_TASKS)]
    return evaluate_world_model(model, tokenizer, rows, show_progress=False)


def online(model, tokenizer, args, coeff: float, out: Path) -> dict:
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from echo_trl.config import EchoGRPOConfig
    from echo_trl.trainer import EchoGRPOTrainer

    from .env import TerminalEnv
    from .trajectories import SYSTEM, TRAIN_TASKS

    prompts = Dataset.from_dict(
        {"prompt": [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": t}] for t, _ in TRAIN_TASKS]}
    )
    config = EchoGRPOConfig(
        output_dir=str(out),
        world_model_coeff=coeff,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=args.num_generations,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=3,
        temperature=1.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=args.seed,
        disable_tqdm=True,
        gradient_checkpointing=False,
    )
    trainer = EchoGRPOTrainer(
        model, args=config, train_dataset=prompts, processing_class=tokenizer, environment_factory=TerminalEnv
    )
    trainer.remove_callback(PrinterCallback)
    t0 = time.time()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "world/tokens_env" in h]
    return {
        "seconds": round(time.time() - t0, 1),
        "env_tokens_trained": sum(h["world/tokens_env"] for h in logs),
        "train_ce_env": [h.get("world/ce_env") for h in logs],
        "reward": [h.get("reward") for h in logs],
        "tool_calls": [h.get("tools/call_frequency") for h in logs],
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    quiet()
    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, model, train = build(args)
    bc_loss = warm_start(model, tokenizer, train, args.warmup_steps, seed=args.seed)
    before = heldout_ce(model, tokenizer)
    print(
        f"warm start: action-token loss {bc_loss:.3f}; held-out env CE {before['ce_env']:.3f} "
        f"over {before['tokens_env']} tokens",
        file=sys.stderr,
    )
    runs = {}
    plan = [("echo", args.world_model_coeff)] + ([] if args.no_baseline else [("grpo", 0.0)])
    for name, coeff in plan:
        m = copy.deepcopy(model)
        info = online(m, tokenizer, args, coeff, out / name)
        after = heldout_ce(m, tokenizer)
        info.update(
            world_model_coeff=coeff,
            heldout_ce_env_before=before["ce_env"],
            heldout_ce_env_after=after["ce_env"],
            rel_change=(after["ce_env"] - before["ce_env"]) / before["ce_env"],
        )
        runs[name] = info
        print(
            f"{name} (lambda={coeff:g}): held-out env CE {before['ce_env']:.3f} -> {after['ce_env']:.3f} "
            f"({100 * info['rel_change']:+.1f}%), {info['env_tokens_trained']:.0f} env tokens seen online, "
            f"{info['seconds']}s",
            file=sys.stderr,
        )
    result = {
        "warm_start_action_loss": bc_loss,
        "heldout_tokens_env": before["tokens_env"],
        "runs": runs,
        "settings": vars(args),
    }
    (out / "results.json").write_text(json.dumps(result, indent=2))
    print(
        json.dumps(
            {
                k: {
                    kk: v[kk]
                    for kk in ("heldout_ce_env_before", "heldout_ce_env_after", "rel_change", "env_tokens_trained")
                }
                for k, v in runs.items()
            }
        )
    )
    return result


if __name__ == "__main__":
    main()
