"""``echo-trl sft``: TRL's SFT with observation supervision, the stage before ECHO-GRPO, the TRL way.

    echo-trl sft --model_name_or_path Qwen/Qwen3-0.6B --dataset_name DATASET --output_dir OUT \
        [--config recipe.yaml] [--observation_weight 1.0] [--min_reward 1.0 [--world_all_episodes]] [--use_peft] ...

    echo-trl sft --compare [--output_dir DIR] ...   # the two-stage comparison on the bundled episodes

TRL, torch and the trainer are imported inside the functions that use them, so ``--help`` starts fast.
"""

from __future__ import annotations

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
TRL's supervised fine-tuning (EchoSFTTrainer, a drop-in SFTTrainer) that also supervises the
environment's output tokens (observation supervision, as in ActObs): the stage before
`echo-trl train`. In a conversation with tool messages, tokens are weighted by role:

    loss = sum_t w_t * CE_t / sum_t w_t
    w_t  = observation_weight (tool-message content), action_weight x TRL's mask (assistant tokens),
           TRL's mask elsewhere (0 / 1; harness warnings 0)

observation_weight 0 is action-only SFT; 1 (default) supervises observations like any other
trained token (with --assistant_only_loss: the assistant's turns and the observations). A dataset
without tool messages trains exactly as with TRL's SFTTrainer. The divisor is the weight sum over
the whole accumulation window and every process (exact under gradient accumulation and DDP).

--dataset_name is any dataset TRL's SFTTrainer takes (a directory or Hub id: `messages`, `text`,
prompt-completion, pre-tokenized; tool-use conversations get the role weights), or an ECHO
trajectory dataset written by `echo-trl build-dataset` (tokenized once per tokenizer, with the
token cache and role masks of `echo-trl train`). --min_reward R trains only rows whose `reward` is
>= R (AWM: 1.0 = completed; default: every row); --world_all_episodes keeps the others for their
observations. Every EchoSFTConfig (TRL SFTConfig + ECHO: packing, assistant_only_loss, loss_type,
max_length, ...), ModelConfig (--use_peft, --lora_r, ...) and script flag below is accepted, on the
command line or in --config YAML. The run ends with save_state() and save_model() in --output_dir;
the model card names the stage and its role weights. Then run
`echo-trl train --model_name_or_path OUTPUT_DIR ...` for ECHO-GRPO from it.

`echo-trl sft --compare` runs the two-stage comparison on the bundled episodes instead (action-only
SFT vs observation-supervised SFT, then ECHO-GRPO from each; `echo-trl sft --compare --help`).
"""


USAGE = (
    "echo-trl sft [--config YAML] --model_name_or_path MODEL --dataset_name DATASET --output_dir DIR "
    "[FLAGS...]\n       echo-trl sft --compare [--help]    # the two-stage comparison on the bundled episodes\n"
    "       echo-trl sft --help-all            # every flag, TRL's and transformers' included"
)


def make_parser():
    """Every flag: the script's, ``EchoSFTConfig``'s (TRL's ``SFTConfig`` + ECHO) and TRL's ``ModelConfig``."""
    from trl import ModelConfig

    from ..command_line import command_parser
    from ..sft_config import EchoSFTConfig

    return command_parser(
        "echo-trl sft", (EchoScriptArguments, EchoSFTConfig, ModelConfig), usage=USAGE, description=DESCRIPTION
    )


def short_help() -> str:
    """``echo-trl sft --help``: ECHO's flags first, the most used TRL ones, a pointer to ``--help-all``
    (stored in ``echo_trl/help/sft.txt``: :mod:`echo_trl.help_pages`)."""
    from ..sft_config import EchoSFTConfig

    return short_training_help("echo-trl sft", USAGE, DESCRIPTION, EchoSFTConfig, COMMON_TRAINING_FLAGS)


def main(argv: list[str]) -> int:
    argv = list(argv)
    if argv and argv[0] == "--compare":
        from ..demo.two_stage import main as compare_main

        return compare_main(argv[1:])
    if wants_help(argv) and "--help-all" not in argv:
        return print_page("sft")
    argv = ["--help" if a == "--help-all" else a for a in argv]
    parser = make_parser()
    script_args, training_args, model_args = parse_training_flags(parser, argv)
    return launched(training_args, lambda: run_sft(script_args, training_args, model_args))


def run_sft(script_args: EchoScriptArguments, training_args, model_args) -> int:
    from ..sft_trainer import EchoSFTTrainer

    inputs = load_run_inputs(script_args, training_args, model_args, "sft", any_schema=True)
    trainer = build_trainer(EchoSFTTrainer, inputs, training_args, model_args)
    trainer.accelerator.print(trainer.reward_filter.summary(script_args.dataset_name))
    train_and_save(trainer, inputs.checkpoint, training_args.output_dir)
    final = [h for h in trainer.state.log_history if "eval_sft/ce_env" in h or "eval_sft/ce_action" in h]
    if final:
        parts = [f"{k[9:]} {final[-1][k]:.4f}" for k in ("eval_sft/ce_env", "eval_sft/ce_action") if k in final[-1]]
        trainer.accelerator.print(f"held-out CE (nats/token, mean over eval batches): {', '.join(parts)}")
    finish(trainer, training_args.output_dir)
    return 0
