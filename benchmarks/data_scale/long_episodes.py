"""Long episodes: ``stats`` time against episode length, and the peak memory of training on a ~20k-token trajectory.

* **stats**: one synthetic episode of N tool calls with short outputs, counted by
  ``echo_trl.tokens.stats.token_stats`` (what ``echo-trl stats`` runs), for each N; also the chat template's own
  render (``apply_chat_template``, transformers + jinja), timed alone. A log-log slope near 1 is linear.
* **train**: ``EchoGRPOTrainer`` offline, 2 optimizer steps on one group of two ~T-token trajectories
  (``per_device_train_batch_size=1``, so one trajectory per forward), tiny Qwen3 model on CPU, with and
  without ``gradient_checkpointing``; each in a fresh process, peak resident set (VmHWM) reported.

    python benchmarks/data_scale/long_episodes.py [--quick] [--json] [--steps 500 2000 ...] [--train_tokens 20000]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

from common import (  # noqa: E402
    echo_trainer,
    ensure_malloc_env,
    fit_exponent,
    measure_call,
    parser,
    report,
    setup,
    status_mb,
)

from echo_trl.roles import Trajectory, tool_call  # noqa: E402

FULL_STEPS, QUICK_STEPS = (500, 2000, 4000, 16000, 50000), (500, 2000, 4000)


def synthetic_episode(steps: int, reward: float = 1.0, group: str = "g") -> Trajectory:
    """An AWM-shaped episode of ``steps`` tool calls, each answered with a short JSON output."""
    completion = []
    for i in range(steps):
        name = ("search", "add")[i % 2]
        completion += [
            {"role": "assistant", "content": "", "tool_calls": [tool_call(name, {"id": i})]},
            {"role": "tool", "name": name, "content": f'{{"ok": true, "step": {i}}}'},
        ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": n,
                "description": f"{n} items",
                "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
            },
        }
        for n in ("search", "add")
    ]
    return Trajectory(
        prompt=[{"role": "system", "content": "Shop agent."}, {"role": "user", "content": "Buy."}],
        completion=completion,
        tools=tools,
        reward=reward,
        scenario="shop",
        task_idx=0,
        group_id=group,
    )


def stats_times(steps: list[int]) -> list[dict]:
    from echo_trl.data.build import trajectories_to_dataset
    from echo_trl.demo.tiny import build_tiny_tokenizer
    from echo_trl.tokens.stats import token_stats

    tok = build_tiny_tokenizer("qwen3")
    token_stats(tok, trajectories_to_dataset([synthetic_episode(10)]), show_progress=False)  # template facts, once
    out = []
    for n in steps:
        t = synthetic_episode(n)
        ds = trajectories_to_dataset([t])
        t0 = time.perf_counter()
        tok.apply_chat_template([*t.prompt, *t.completion], tools=t.tools, tokenize=False)
        render = time.perf_counter() - t0
        t0 = time.perf_counter()
        s = token_stats(tok, ds, show_progress=False)
        out.append({"steps": n, "tokens": s["total_tokens"], "stats_s": time.perf_counter() - t0, "render_s": render})
    return out


def train_child(tokens: int, checkpointing: bool) -> dict:
    """Run in a fresh process: 2 offline steps on a group of two ~``tokens``-token trajectories."""
    from echo_trl.data.build import trajectories_to_dataset
    from echo_trl.demo.tiny import build_tiny_model, build_tiny_tokenizer
    from echo_trl.tokens.tokenization import tokenize_with_roles

    tok = build_tiny_tokenizer("qwen3")
    per_step = len(tokenize_with_roles(tok, synthetic_episode(101))) - len(
        tokenize_with_roles(tok, synthetic_episode(1))
    )
    steps = max(1, round(tokens * 100 / per_step))
    ds = trajectories_to_dataset([synthetic_episode(steps, 1.0), synthetic_episode(steps, 0.0)])
    n_tokens = len(tokenize_with_roles(tok, synthetic_episode(steps)))
    model = build_tiny_model(tok, "qwen3", hidden_size=32, num_layers=2, num_heads=4)
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        trainer = echo_trainer(
            model,
            tok,
            ds,
            out,
            per_device_train_batch_size=1,
            gradient_accumulation_steps=2,
            max_steps=2,
            gradient_checkpointing=checkpointing,
        )
        setup_peak = status_mb("VmHWM")  # model, dataset, trainer (this process's own: it was exec'ed fresh)
        seconds, delta = measure_call(trainer.train)  # resets the high-water mark first
    return {
        "tokens": n_tokens,
        "gradient_checkpointing": checkpointing,
        "train_2_steps_s": seconds,
        "peak_rss_mb": status_mb("VmHWM"),
        "train_peak_above_start_mb": delta,
        "setup_peak_rss_mb": setup_peak,
        "loss": [h["loss"] for h in trainer.state.log_history if "loss" in h],
    }


def train_peaks(tokens: int) -> list[dict]:
    out = []
    for ckpt in (False, True):
        cmd = [sys.executable, __file__, "--child_tokens", str(tokens), *(["--child_checkpointing"] if ckpt else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            out.append({"tokens": tokens, "gradient_checkpointing": ckpt, "error": proc.stderr.strip()[-2000:]})
        else:
            out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def main(argv=None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="+", default=None, help="episode lengths (tool calls) for stats")
    p.add_argument("--train_tokens", type=int, default=20000, help="tokens of the trained trajectory (0: skip)")
    p.add_argument("--child_tokens", type=int, default=None, help="internal: run one training child")
    p.add_argument("--child_checkpointing", action="store_true", help="internal: that child checkpoints")
    args = p.parse_args(argv)
    setup(args)
    if args.child_tokens is not None:
        print(json.dumps(train_child(args.child_tokens, args.child_checkpointing)))
        return {}
    steps = args.steps or list(QUICK_STEPS if args.quick else FULL_STEPS)
    stats = stats_times(steps)
    results = {
        "stats": stats,
        "stats_exponent": fit_exponent([r["tokens"] for r in stats], [r["stats_s"] for r in stats]),
        "render_exponent": fit_exponent([r["tokens"] for r in stats], [r["render_s"] for r in stats]),
    }
    report(
        [(str(r["steps"]), str(r["tokens"]), f"{r['stats_s']:.3f}", f"{r['render_s']:.3f}") for r in stats],
        ("steps", "tokens", "stats s", "render s"),
        {},
        argparse_off(args),
    )
    print(
        f"log-log slope of time on tokens: stats {results['stats_exponent']:.2f}, "
        f"template render {results['render_exponent']:.2f} (1 = linear)"
    )
    if args.train_tokens:
        results["train"] = train_peaks(args.train_tokens)
        for r in results["train"]:
            if "error" in r:
                print(f"train gradient_checkpointing={r['gradient_checkpointing']}: FAILED {r['error'][-300:]}")
            else:
                print(
                    f"train {r['tokens']} tokens, gradient_checkpointing={r['gradient_checkpointing']}: "
                    f"2 steps {r['train_2_steps_s']:.1f} s, peak RSS during training {r['peak_rss_mb']:.0f} MiB "
                    f"({r['train_peak_above_start_mb']:.0f} MiB above its start; "
                    f"{r['setup_peak_rss_mb']:.0f} MiB peak while setting up)"
                )
    report([], ("",), results, args)
    return results


def argparse_off(args):
    """``args`` with JSON output off (the table's ``report`` call prints no JSON line)."""
    import argparse

    return argparse.Namespace(**{**vars(args), "json": False, "output": None})


if __name__ == "__main__":
    ensure_malloc_env()
    main()
