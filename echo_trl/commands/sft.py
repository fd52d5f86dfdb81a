"""``echo-trl sft``: the SFT stage before ECHO-GRPO, with observation supervision, the TRL way.

    echo-trl sft --model_name_or_path Qwen/Qwen3-0.6B --dataset_name DATASET --output_dir OUT \
        [--config recipe.yaml] [--world_model_coeff 1.0] [--min_reward 1.0 [--world_all_episodes]] [--use_peft] ...

    echo-trl sft --compare [--output_dir DIR] ...   # the two-stage comparison on the bundled episodes

TRL, torch and the trainer are imported inside the functions that use them, so ``--help`` starts fast.
"""

from __future__ import annotations

import argparse

from ..errors import EchoTrlError

DESCRIPTION = """\
Supervised fine-tuning on recorded agent trajectories that also supervises the environment's
output tokens (observation supervision, as in ActObs), the stage before `echo-trl train`
(EchoSFTTrainer, a TRL SFTTrainer). Per-token cross-entropy weighted by role:

    loss = sum_t w_t * CE_t / sum_t w_t
    w_t  = action_weight (agent tokens), world_model_coeff (env_output tokens), 0 (context, warnings)

world_model_coeff 0 is TRL's SFT on the action tokens alone; 1 (default) supervises observations
exactly as actions. The divisor is the weight sum over the whole accumulation window and every
process, so gradient accumulation and multi-process runs are exact.

--dataset_name is a trajectory dataset (a directory written by `echo-trl build-dataset`, or a Hub
dataset id with that schema), tokenized once per tokenizer with the same cache and role masks as
`echo-trl train`. --min_reward R trains the action tokens only of episodes with reward >= R (AWM:
1.0 = completed; default: every episode); --world_all_episodes keeps the others for the observation
term. Every EchoSFTConfig (TRL SFTConfig + ECHO), ModelConfig (--use_peft, --lora_r, ...) and script
flag below is accepted, on the command line or in --config YAML. The run ends with save_state() and
save_model() in --output_dir; the model card names the stage and its role weights. Then run
`echo-trl train --model_name_or_path OUTPUT_DIR ...` for ECHO-GRPO from it.

`echo-trl sft --compare` runs the two-stage comparison on the bundled episodes instead (action-only
SFT vs observation-supervised SFT, then ECHO-GRPO from each; `echo-trl sft --compare --help`).
"""


def make_parser():
    from trl import ModelConfig, TrlParser

    from ..sft_config import EchoSFTConfig
    from .train import EchoScriptArguments

    usage = (
        "echo-trl sft [--config YAML] --model_name_or_path MODEL --dataset_name DATASET --output_dir DIR "
        "[FLAGS...]\n       echo-trl sft --compare [--help]    # the two-stage comparison on the bundled episodes"
    )
    return TrlParser(
        (EchoScriptArguments, EchoSFTConfig, ModelConfig),
        prog="echo-trl sft",
        usage=usage,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )


def main(argv: list[str]) -> int:
    argv = list(argv)
    if argv and argv[0] == "--compare":
        from ..demo.two_stage import main as compare_main

        return compare_main(argv[1:])
    from .config_file import check_config_file

    check_config_file(argv)
    parser = make_parser()
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as exc:  # TrainingArguments / SFTConfig / EchoSFTConfig validation: a usage error
        if "not used by the HfArgumentParser" in str(exc):
            unknown = str(exc).split(":", 1)[1].strip(" []").replace("'", "").replace(",", "")
            raise EchoTrlError(
                f"unrecognized arguments: {unknown} (`echo-trl sft --help` lists every flag; "
                "flags are never abbreviated)"
            ) from None
        hint = " (on a machine without a GPU pass --use_cpu)" if "use_cpu" in str(exc) else ""
        raise EchoTrlError(f"invalid training arguments: {' '.join(str(exc).split())}{hint}") from exc
    return run_sft(script_args, training_args, model_args)


def load_split(name: str, split: str):
    """One split of a trajectory dataset, a missing split as one line."""
    from .loading import load_dataset_named

    try:
        return load_dataset_named(name, split=split)
    except (KeyError, ValueError) as exc:
        if "split" in str(exc).lower() or isinstance(exc, KeyError):
            raise EchoTrlError(f"{name}: no split {split!r} ({exc})") from None
        raise


def run_sft(script_args, training_args, model_args) -> int:
    from trl import get_peft_config, get_quantization_config

    from ..data.hub import locate
    from ..data.store import saved_dataset_kind
    from ..sft_trainer import EchoSFTTrainer
    from .checkpoints import resolve_checkpoint

    if not model_args.model_name_or_path:
        raise EchoTrlError("--model_name_or_path is required (`echo-trl sft --help`)")
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
    checkpoint = resolve_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    train_dataset = load_split(script_args.dataset_name, script_args.dataset_train_split)
    eval_dataset = None
    if evaluating:
        if script_args.eval_dataset_name:
            eval_dataset = load_split(script_args.eval_dataset_name, script_args.dataset_test_split)
        elif saved_dataset_kind(script_args.dataset_name) == "dataset":
            raise EchoTrlError(
                f"{script_args.dataset_name} is a single-split dataset directory: pass the held-out "
                "trajectories with --eval_dataset_name DIR"
            )
        else:
            eval_dataset = load_split(script_args.dataset_name, script_args.dataset_test_split)
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    trainer = EchoSFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    trainer.accelerator.print(trainer.reward_filter.summary(script_args.dataset_name))
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_state()
    trainer.save_model(training_args.output_dir)
    final = [h for h in trainer.state.log_history if "eval_sft/ce_env" in h or "eval_sft/ce_action" in h]
    if final:
        parts = [f"{k[9:]} {final[-1][k]:.4f}" for k in ("eval_sft/ce_env", "eval_sft/ce_action") if k in final[-1]]
        trainer.accelerator.print(f"held-out CE (nats/token, mean over eval batches): {', '.join(parts)}")
    trainer.accelerator.print(f"model and trainer_state.json saved to {training_args.output_dir}")
    trainer.accelerator.end_training()
    return 0
