"""``echo-trl train``: ECHO training the TRL way; with no arguments, a CPU demo.

    echo-trl train --model_name_or_path Qwen/Qwen3-0.6B --dataset_name DATASET --output_dir OUT \
        [--config recipe.yaml] [--world_model_coeff 0.05] [--use_peft] [any EchoGRPOConfig / ModelConfig flag]

    echo-trl train                     # the demo: bundled AWM episodes, a tiny local model, ECHO vs GRPO
    echo-trl train --demo [--output_dir DIR] [--data_dir DIR] [--max_steps N] ...

TRL, torch and the trainer are imported inside the functions that use them, so the demo and ``--help``
start without loading what they do not need.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..errors import EchoTrlError

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
models, metrics.json and env_ce.png to the output dir (never over a previous run's without --overwrite_output_dir).
`echo-trl train --demo --help` lists its options (package echo_trl.demo).
"""


@dataclass
class EchoScriptArguments:
    """Script arguments of ``echo-trl train`` (TRL's names)."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Trajectory dataset: a local `echo-trl build-dataset` directory or a Hub id."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split to train on."})
    dataset_test_split: str = field(
        default="test", metadata={"help": "Held-out split for evaluation (used when --eval_strategy is not 'no')."}
    )
    eval_dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Held-out trajectory dataset (directory or Hub id) for evaluation; default: "
            "--dataset_test_split of --dataset_name."
        },
    )


def make_parser():
    from trl import ModelConfig, TrlParser

    from ..config import EchoGRPOConfig

    usage = (
        "echo-trl train [--config YAML] --model_name_or_path MODEL --dataset_name DATASET --output_dir DIR "
        "[FLAGS...]\n       echo-trl train                  # no arguments: the CPU demo (ECHO vs GRPO)\n"
        "       echo-trl train --demo --help    # the demo's options"
    )
    # allow_abbrev=False: `--max_step 3` must not silently become --max_steps (HfArgumentParser passes it on
    # to argparse and already accepts --max-steps for --max_steps)
    return TrlParser(
        (EchoScriptArguments, EchoGRPOConfig, ModelConfig),
        prog="echo-trl train",
        usage=usage,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )


def main(argv: list[str]) -> int:
    argv = list(argv)
    if not argv or argv[0] == "--demo":
        from ..demo.run import main as demo_main

        return demo_main(argv[1:])
    from .config_file import check_config_file

    check_config_file(argv)
    parser = make_parser()
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except (ValueError, TypeError, ArithmeticError) as exc:  # TrainingArguments / GRPOConfig validation (e.g.
        # `--logging_steps inf`: OverflowError): a usage error, not a crash
        if "not used by the HfArgumentParser" in str(exc):
            unknown = str(exc).split(":", 1)[1].strip(" []").replace("'", "").replace(",", "")
            raise EchoTrlError(
                f"unrecognized arguments: {unknown} (`echo-trl train --help` lists every flag; "
                "flags are never abbreviated)"
            ) from None
        hint = (
            " (on a machine without a GPU pass --use_cpu; `echo-trl train` with no arguments runs the CPU demo)"
            if "use_cpu" in str(exc)
            else ""
        )
        raise EchoTrlError(f"invalid training arguments: {' '.join(str(exc).split())}{hint}") from exc
    from .launch_checks import check_launch, leave_process_group

    try:
        check_launch(training_args)  # what accelerate would run silently differently, refused before loading
        return run_training(script_args, training_args, model_args)
    finally:
        leave_process_group()  # every path: the trainer collected, then the process group destroyed


def run_training(script_args: EchoScriptArguments, training_args, model_args) -> int:
    from trl import get_peft_config, get_quantization_config

    from ..data.hub import locate
    from ..data.store import saved_dataset_kind
    from ..outputs import check_output_dir
    from ..trainer import EchoGRPOTrainer
    from .checkpoints import checkpoint_saves, resolve_checkpoint
    from .loading import check_model_dir

    if not model_args.model_name_or_path:
        raise EchoTrlError("--model_name_or_path is required (run `echo-trl train` with no arguments for the demo)")
    if not script_args.dataset_name:
        raise EchoTrlError(
            "--dataset_name is required: a trajectory dataset directory or Hub id "
            "(build one with `echo-trl build-dataset`)"
        )
    evaluating = training_args.eval_strategy != "no"
    for name, what in (
        (model_args.model_name_or_path, "--model_name_or_path"),
        (script_args.dataset_name, "--dataset_name"),
        (script_args.eval_dataset_name if evaluating else None, "--eval_dataset_name"),
    ):
        if name:
            locate(name, what)  # every name checked before anything slow is loaded
    check_model_dir(model_args.model_name_or_path, "--model_name_or_path")  # a local one holds a model
    check_output_dir(training_args.output_dir, flag="--output_dir")  # a file or read-only: before the work
    checkpoint = resolve_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    train_dataset = _load_split(script_args.dataset_name, script_args.dataset_train_split)
    eval_dataset = None
    if evaluating:
        if script_args.eval_dataset_name:
            eval_dataset = _load_split(script_args.eval_dataset_name, script_args.dataset_test_split)
        elif saved_dataset_kind(script_args.dataset_name) == "dataset":
            raise EchoTrlError(
                f"{script_args.dataset_name} is a single-split dataset directory: pass the held-out "
                "trajectories with --eval_dataset_name DIR"
            )
        else:
            eval_dataset = _load_split(script_args.dataset_name, script_args.dataset_test_split)
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    trainer = EchoGRPOTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    with checkpoint_saves(training_args.output_dir, trainer.model):  # a full disk: one line, no cut checkpoint
        trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_state()
        trainer.save_model(training_args.output_dir)
    final = [h for h in trainer.state.log_history if "eval_world/ce_env" in h]
    if final:
        trainer.accelerator.print(f"held-out env CE: {final[-1]['eval_world/ce_env']:.4f} nats/token")
    trainer.accelerator.print(f"model and trainer_state.json saved to {training_args.output_dir}")
    for tracker in trainer.accelerator.trackers:
        tracker.finish()
    trainer.accelerator.wait_for_everyone()  # no rank leaves the group while another still saves
    return 0  # the trainer goes with this frame; main() then destroys the process group


def _load_split(name: str, split: str):
    from .loading import load_dataset_named

    try:
        return load_dataset_named(name, split=split)
    except (KeyError, ValueError) as exc:
        if "split" in str(exc).lower() or isinstance(exc, KeyError):
            raise EchoTrlError(f"{name}: no split {split!r} ({exc})") from None
        raise
