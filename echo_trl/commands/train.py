"""``echo-trl train``: ECHO training the TRL way; with no arguments, a CPU demo.

    echo-trl train --model_name_or_path Qwen/Qwen3-0.6B --dataset_name DATASET --output_dir OUT \
        [--config recipe.yaml] [--world_model_coeff 0.05] [--use_peft] [any EchoGRPOConfig / ModelConfig flag]

    echo-trl train                     # the demo: bundled AWM episodes, a tiny local model, ECHO vs GRPO
    echo-trl train --demo [--output_dir DIR] [--data_dir DIR] [--max_steps N] ...

TRL, torch and the trainer are imported inside the functions that use them, so the demo and ``--help``
start without loading what they do not need.
"""

from __future__ import annotations

from ..errors import EchoTrlError
from ..help_pages import print_page, wants_help
from .support.training_run import (
    COMMON_TRAINING_FLAGS,
    EchoScriptArguments,
    build_trainer,
    finish,
    launched,
    load_run_inputs,
    parse_training_flags,
    short_training_help,
    train_and_save,
)

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


USAGE = (
    "echo-trl train [--config YAML] --model_name_or_path MODEL --dataset_name DATASET --output_dir DIR "
    "[FLAGS...]\n       echo-trl train                  # no arguments: the CPU demo (ECHO vs GRPO)\n"
    "       echo-trl train --demo --help    # the demo's options\n"
    "       echo-trl train --help-all       # every flag, TRL's and transformers' included"
)

#: TRL flags the short ``--help`` lists after ECHO's (GRPO's own beside the trainer's).
COMMON_FLAGS = (*COMMON_TRAINING_FLAGS[:6], "num_generations", "temperature", "beta", *COMMON_TRAINING_FLAGS[6:])


def make_parser():
    """Every flag: the script's, ``EchoGRPOConfig``'s (TRL's ``GRPOConfig`` + ECHO) and TRL's ``ModelConfig``."""
    from trl import ModelConfig

    from ..command_line import command_parser
    from ..config import EchoGRPOConfig

    return command_parser(
        "echo-trl train", (EchoScriptArguments, EchoGRPOConfig, ModelConfig), usage=USAGE, description=DESCRIPTION
    )


def short_help() -> str:
    """``echo-trl train --help``: ECHO's flags first, the most used TRL ones, a pointer to ``--help-all``
    (stored in ``echo_trl/help/train.txt``: :mod:`echo_trl.help_pages`)."""
    from ..config import EchoGRPOConfig

    return short_training_help("echo-trl train", USAGE, DESCRIPTION, EchoGRPOConfig, COMMON_FLAGS)


def main(argv: list[str]) -> int:
    argv = list(argv)
    if argv and argv[0] == "--demo" and wants_help(argv[1:]):
        return print_page("demo")  # rendered from the demo's parser ahead of time: no TRL import for --help
    if not argv or argv[0] == "--demo":
        from ..demo.run import main as demo_main

        return demo_main(argv[1:])
    if wants_help(argv) and "--help-all" not in argv:
        return print_page("train")
    argv = ["--help" if a == "--help-all" else a for a in argv]
    check_model_named(argv)
    parser = make_parser()
    script_args, training_args, model_args = parse_training_flags(
        parser, argv, hint_use_cpu="; `echo-trl train` with no arguments runs the CPU demo"
    )
    return launched(training_args, lambda: run_training(script_args, training_args, model_args))


MODEL_FLAGS = ("--model_name_or_path", "--model-name-or-path", "--config")


def check_model_named(argv: list[str]) -> None:
    """Flags without a model (``echo-trl train --max_steps 1``) are most likely meant for the demo: say what to add,
    before TRL's checks answer with something unrelated (bf16 needs a GPU)."""
    if "--help" in argv or any(a.split("=", 1)[0] in MODEL_FLAGS for a in argv):
        return
    flags = " ".join(argv)
    raise EchoTrlError(
        f"no --model_name_or_path: to run the CPU demo with these flags add --demo (`echo-trl train --demo {flags}`); "
        "to train a model pass --model_name_or_path MODEL --dataset_name DATASET --output_dir DIR"
    )


def run_training(script_args: EchoScriptArguments, training_args, model_args) -> int:
    from ..trainer import EchoGRPOTrainer

    inputs = load_run_inputs(script_args, training_args, model_args, "train")
    trainer = build_trainer(EchoGRPOTrainer, inputs, training_args, model_args)
    train_and_save(trainer, inputs.checkpoint, training_args.output_dir)
    final = [h for h in trainer.state.log_history if "eval_world/ce_env" in h]
    if final:
        trainer.accelerator.print(f"held-out env CE: {final[-1]['eval_world/ce_env']:.4f} nats/token")
    finish(trainer, training_args.output_dir)
    return 0  # the trainer goes with this frame; launched() then destroys the process group
