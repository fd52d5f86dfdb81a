"""SFT then ECHO on the bundled episodes: action-only SFT vs observation-supervised SFT (ActObs), then ECHO-GRPO
from each, with held-out env CE and action CE after every stage.

    python -m echo_trl.demo.two_stage [--output_dir DIR] [--sft_steps N] [--grpo_steps N] ...
    echo-trl sft --compare [same options]

The simplifications a CPU comparison makes (so it runs in minutes on 2 cores):

* a tiny Qwen3-architecture model built locally and warmed up env-blind (:mod:`echo_trl.demo.warmup`), the same
  start for both arms; tool schemas reduced to their names (:func:`echo_trl.demo.run.names_only_tools`);
* the bundled AWM episodes of ``data/episodes``, split by task with ``splits.json`` (held-out tasks never trained);
* SFT on the successful train episodes (``--min_reward``, default 1.0), the two arms differing only in
  ``observation_weight`` (0: action-only; ``--observation_weight``, default 1: observations supervised like
  actions); ``--world_all_episodes`` also gives the ActObs arm the observations of the other train episodes;
* ECHO-GRPO offline on every train episode (recorded rewards), the same lambda, steps and seed for both arms;
* everything seeded (``--seed``) and run on ``--threads`` torch CPU threads (default 1, as the demo: a float sum's
  order depends on the thread count): the same command prints the same table.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EchoTrlError
from .run import REPO_DATA, names_only_tools, split_by_task
from .tiny import tiny_model_for
from .warmup import DEMO_THREADS, WARMUP_LEARNING_RATE, WARMUP_STEPS, warmup_steps_help

#: The arms: (label, output subdirectory of the SFT stage).
ARMS = (("action-only SFT", "sft_action_only"), ("ActObs SFT", "sft_actobs"))

PROG = "echo-trl sft --compare"
DESCRIPTION = (
    "SFT then ECHO on the bundled AWM episodes: action-only SFT vs observation-supervised (ActObs) SFT, then "
    "ECHO-GRPO from each; prints held-out env CE and action CE after every stage."
)


@dataclass
class TwoStageArguments:
    """The options of the two-stage comparison (``echo-trl sft --compare``, ``python -m echo_trl.demo.two_stage``).

    ``observation_weight`` is the ActObs arm's ``EchoSFTConfig.observation_weight`` (the action-only arm's is 0);
    ``world_model_coeff`` is ECHO-GRPO's lambda, as in ``EchoGRPOConfig``.
    """

    output_dir: str = field(default="outputs/two-stage", metadata={"help": "models and metrics.json go here"})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "replace a previous run's outputs"})
    data_dir: str | None = field(default=None, metadata={"help": f"AWM episode files/dirs (default: {REPO_DATA})"})
    sft_steps: int = field(default=30, metadata={"help": "optimizer steps of each SFT run"})
    grpo_steps: int = field(default=12, metadata={"help": "optimizer steps of each ECHO-GRPO run"})
    sft_learning_rate: float = field(default=2e-3, metadata={"help": "learning rate of the SFT runs"})
    grpo_learning_rate: float = field(default=1e-3, metadata={"help": "learning rate of the ECHO-GRPO runs"})
    batch_size: int = field(default=4, metadata={"help": "trajectories per optimizer step (both stages)"})
    min_reward: float = field(default=1.0, metadata={"help": "SFT trains the actions of episodes >= this"})
    observation_weight: float = field(
        default=1.0, metadata={"help": "observation_weight of the ActObs SFT arm (the action-only arm's is 0)"}
    )
    world_all_episodes: bool = field(
        default=False,
        metadata={"help": "the ActObs arm also trains on the observations of the train episodes below --min_reward"},
    )
    world_model_coeff: float = field(default=0.05, metadata={"help": "lambda of the ECHO-GRPO stage"})
    max_completion_length: int = field(default=1024, metadata={"help": "completion tokens kept per trajectory"})
    model_cache_dir: str | None = field(
        default=None, metadata={"help": "where the tiny model is built once (default: cache)"}
    )
    warmup_steps: int = field(default=WARMUP_STEPS, metadata={"help": warmup_steps_help("both arms")})
    warmup_learning_rate: float = field(default=WARMUP_LEARNING_RATE, metadata={"help": "warm-up learning rate"})
    seed: int = field(default=0, metadata={"help": "seed of every stage"})
    threads: int = field(
        default=DEMO_THREADS,
        metadata={
            "help": "torch CPU threads of every stage (default 1, as the demo: the tiny model gains nothing from "
            "more; the printed numbers are reproducible at the same count)"
        },
    )

    def __post_init__(self):
        from ..command_line import non_negative_number, positive_int, positive_number

        for name in ("sft_steps", "grpo_steps", "batch_size", "max_completion_length", "threads"):
            positive_int(name, getattr(self, name))
        for name in ("sft_learning_rate", "grpo_learning_rate", "warmup_learning_rate"):
            positive_number(name, getattr(self, name))
        non_negative_number("observation_weight", self.observation_weight)
        non_negative_number("world_model_coeff", self.world_model_coeff)
        non_negative_number("warmup_steps", self.warmup_steps)


def parse_args(argv: list[str]) -> TwoStageArguments:
    from ..command_line import command_parser, parse_command

    parser = command_parser(PROG, (TwoStageArguments,), description=DESCRIPTION)
    (args,) = parse_command(parser, argv)
    return args


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


def _config_common(args, out: Path, steps: int, lr: float) -> dict[str, Any]:
    return dict(
        output_dir=str(out),
        max_steps=steps,
        learning_rate=lr,
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
        seed=args.seed,
        disable_tqdm=True,
    )


def _sft(start: Path, train, weight: float, world_all: bool, args, out: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from ..progress import training_progress
    from ..sft_config import EchoSFTConfig
    from ..sft_trainer import EchoSFTTrainer

    torch.manual_seed(args.seed)
    config = EchoSFTConfig(
        **_config_common(args, out, args.sft_steps, args.sft_learning_rate),
        max_length=None,  # whole trajectories (max_completion_length cuts them at message ends)
        observation_weight=weight,
        min_reward=args.min_reward,
        world_all_episodes=world_all,
    )
    trainer = EchoSFTTrainer(
        AutoModelForCausalLM.from_pretrained(start),
        args=config,
        train_dataset=train,
        processing_class=AutoTokenizer.from_pretrained(start),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(training_progress(f"SFT observation_weight={weight:g}"))
    trainer.train()
    trainer.save_model(str(out))
    trainer.processing_class.save_pretrained(str(out))
    return {"episodes": trainer.reward_filter.summary("train split"), "model_dir": str(out)}


def _grpo(start: Path, train, args, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from ..config import EchoGRPOConfig
    from ..progress import training_progress
    from ..trainer import EchoGRPOTrainer

    torch.manual_seed(args.seed)
    config = EchoGRPOConfig(
        **_config_common(args, out, args.grpo_steps, args.grpo_learning_rate),
        world_model_coeff=args.world_model_coeff,
        num_generations=2,
    )
    trainer = EchoGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(start),
        args=config,
        train_dataset=train,
        processing_class=AutoTokenizer.from_pretrained(start),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(training_progress("ECHO-GRPO"))
    trainer.train()
    trainer.save_model(str(out))


def _held_out(path: Path, held, args) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..train.world_eval import evaluate_world_model

    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return evaluate_world_model(
        model, tokenizer, held, max_completion_length=args.max_completion_length, show_progress=False
    )


def _episodes(args):
    from ..data.build import build_awm_dataset
    from ..data.readers.episode_files import find_episode_files

    source = Path(args.data_dir) if args.data_dir else REPO_DATA
    label = str(source) if args.data_dir else "data/episodes"
    files = find_episode_files([source])
    if not files:
        raise EchoTrlError(f"no episode files (.json/.jsonl) under {source}")
    splits = source / "splits.json" if args.data_dir else REPO_DATA.parent / "awm_scenarios" / "splits.json"
    ds = names_only_tools(build_awm_dataset(files, strict=False))
    train, held = split_by_task(ds, splits if splits.is_file() else None)
    if not len(held) or len(train) < args.batch_size:
        raise EchoTrlError(f"{source}: the split leaves {len(train)} train / {len(held)} held-out episodes")
    return train, held, label


def run(args: TwoStageArguments) -> int:
    """The comparison, with torch's CPU threads at ``--threads`` for its duration (as the demo's)."""
    from ..progress import quiet_libraries
    from .warmup import torch_threads

    quiet_libraries(progress_bars=True, user_warnings=True)
    with torch_threads(args.threads):
        return _run(args)


def _run(args: TwoStageArguments) -> int:
    from ..data.cache_dir import cache_home
    from .warmup import WarmupSettings, warm_up_tiny_model

    t0 = time.time()
    out = Path(args.output_dir)
    if (out / "metrics.json").exists() and not args.overwrite_output_dir:
        raise EchoTrlError(f"{out} holds a previous run: pass --overwrite_output_dir, or choose another --output_dir")
    out.mkdir(parents=True, exist_ok=True)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    train, held, source = _episodes(args)
    log(f"two-stage comparison: {len(train)} train / {len(held)} held-out episodes from {source}")
    base = tiny_model_for(train, Path(args.model_cache_dir) if args.model_cache_dir else cache_home())
    start, _ = warm_up_tiny_model(
        base,
        train,
        WarmupSettings(
            steps=args.warmup_steps,
            learning_rate=args.warmup_learning_rate,
            batch_size=args.batch_size,
            max_completion_length=args.max_completion_length,
            seed=args.seed,
            threads=args.threads,
        ),
        log=log,
    )
    rows: list[tuple[str, dict[str, Any]]] = [("start (warmed-up tiny model)", _held_out(start, held, args))]
    episodes = {}
    for (label, name), weight in zip(ARMS, (0.0, args.observation_weight), strict=True):
        log(f"{label} (observation_weight={weight:g}), {args.sft_steps} steps ...")
        world_all = args.world_all_episodes and weight > 0
        episodes[label] = _sft(start, train, weight, world_all, args, out / name)["episodes"]
        rows.append((f"{label} (observation_weight={weight:g})", _held_out(out / name, held, args)))
    for label, name in ARMS:
        log(f"ECHO-GRPO from {label}, {args.grpo_steps} steps ...")
        _grpo(out / name, train, args, out / f"{name}_echo")
        rows.append(
            (f"{label} -> ECHO-GRPO (lambda={args.world_model_coeff:g})", _held_out(out / f"{name}_echo", held, args))
        )

    metrics = {
        "source": source,
        "train_episodes": len(train),
        "heldout_episodes": len(held),
        "sft_episodes": episodes,
        "settings": {
            k: v for k, v in dataclasses.asdict(args).items() if k not in ("output_dir", "overwrite_output_dir")
        },
        "stages": {label: r for label, r in rows},
        "wall_seconds": round(time.time() - t0, 1),
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    print(
        f"SFT then ECHO: {len(train)} train / {len(held)} held-out episodes ({source}); SFT {args.sft_steps} steps, "
        f"ECHO-GRPO {args.grpo_steps} steps, seed {args.seed}, {args.threads} torch thread"
        f"{'' if args.threads == 1 else 's'}"
    )
    for label, line in episodes.items():
        print(f"  {label}: {line}")
    print(f"| {'stage':<52} | held-out env CE | held-out action CE |")
    print(f"|{'-' * 54}|----------------:|-------------------:|")
    for label, r in rows:
        print(f"| {label:<52} | {r['ce_env']:>15.3f} | {r['ce_action']:>18.3f} |")
    print(
        f"(nats/token over {rows[0][1]['tokens_env']} env / {rows[0][1]['tokens_action']} action tokens; "
        f"{metrics['wall_seconds']:.0f}s; {out / 'metrics.json'})"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
