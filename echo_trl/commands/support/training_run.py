"""What ``echo-trl train`` and ``echo-trl sft`` share: parsing TRL flags into one-line usage errors, checking
every name before anything slow loads, the launch checks and teardown, and the save at the end.

One place, so a check added for one stage (a damaged checkpoint, a full disk, a dataset given as a model, an
FSDP plugin accelerate would drop) holds for the other. TRL, torch and the trainers are imported inside the
functions, so ``--help`` starts fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import EchoTrlError


@dataclass
class EchoScriptArguments:
    """Script arguments of ``echo-trl train`` and ``echo-trl sft`` (TRL's names)."""

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


#: TRL / transformers flags the short ``--help`` of ``train`` and ``sft`` lists after ECHO's (rest: ``--help-all``).
COMMON_TRAINING_FLAGS = (
    "output_dir",
    "max_steps",
    "num_train_epochs",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "bf16",
    "use_cpu",
    "eval_strategy",
    "eval_steps",
    "logging_steps",
    "save_steps",
    "report_to",
    "resume_from_checkpoint",
    "seed",
    "push_to_hub",
)
#: TRL ``ModelConfig`` flags a short ``--help`` lists.
COMMON_MODEL_FLAGS = ("model_name_or_path", "dtype", "use_peft", "lora_r", "lora_alpha", "lora_target_modules")


def short_training_help(prog: str, usage: str, description: str, config: type, common: tuple[str, ...]) -> str:
    """The short ``--help`` of ``prog`` (``train`` / ``sft``): the script flags and every flag ``config`` adds to
    TRL's first, then the most used TRL / model flags, then how many more ``--help-all`` lists."""
    import dataclasses

    from trl import ModelConfig

    from ...command_line import command_parser
    from ...help_pages import field_group, more_flags_line, own_fields, render

    groups = [
        field_group(EchoScriptArguments, [f.name for f in dataclasses.fields(EchoScriptArguments)], "dataset flags"),
        field_group(config, own_fields(config), f"ECHO flags ({config.__name__})"),
        field_group(config, [n for n in common if n not in own_fields(config)], "most used TRL flags"),
        field_group(ModelConfig, COMMON_MODEL_FLAGS, "model flags (TRL ModelConfig)"),
    ]
    shown = sum(len(dataclasses.fields(g)) for g in groups)
    total = sum(len([f for f in dataclasses.fields(c) if f.init]) for c in (EchoScriptArguments, config, ModelConfig))
    what = f"TRL's {config.__mro__[1].__name__}, transformers' TrainingArguments, TRL's ModelConfig"
    epilog = more_flags_line(prog, shown, total, what)
    return render(command_parser(prog, groups, usage=usage, description=description, epilog=epilog))


def parse_training_flags(parser, argv: list[str], hint_use_cpu: str = "") -> tuple:
    """:func:`~echo_trl.command_line.parse_command` with TrainingArguments' validation errors (``ValueError``, a
    ``TypeError`` of a wrong type, ``--logging_steps inf``'s ``OverflowError``) as one-line errors."""
    from ...command_line import parse_command

    try:
        parsed = parse_command(parser, argv)
    except (ValueError, TypeError, ArithmeticError) as exc:
        hint = f" (on a machine without a GPU pass --use_cpu{hint_use_cpu})" if "use_cpu" in str(exc) else ""
        raise EchoTrlError(f"invalid training arguments: {' '.join(str(exc).split())}{hint}") from exc
    quiet_off_a_terminal(parsed, argv)
    return parsed


def quiet_off_a_terminal(parsed: tuple, argv: list[str]) -> None:
    """The Trainer's step bar follows the project's rule for every bar (:func:`~echo_trl.progress.progress_enabled`:
    a terminal, or ``ECHO_TRL_PROGRESS=1``), so a log file or a pipe gets the logged metrics, not thousands of
    carriage-return frames; ``disable_tqdm`` given on the command line or in the ``--config`` file wins."""
    from ...command_line import check_config_file
    from ...progress import progress_enabled

    given = any(a.split("=")[0] in ("--disable_tqdm", "--disable-tqdm") for a in argv)
    if progress_enabled() or given or "disable_tqdm" in (check_config_file(argv) or {}):
        return
    for settings in parsed:
        if hasattr(settings, "disable_tqdm"):
            settings.disable_tqdm = True


def launched(training_args, run: Callable[[], int]) -> int:
    """``run()`` after the launch checks (what accelerate would run silently differently is refused before
    any model loads), and the process group left on every path once the trainer is gone."""
    from .launch_checks import check_launch, leave_process_group

    try:
        check_launch(training_args)
        return run()
    finally:
        leave_process_group()


@dataclass
class RunInputs:
    """What a training command loads before building its trainer."""

    train_dataset: Any
    eval_dataset: Any
    checkpoint: str | None


def load_run_inputs(
    script_args: EchoScriptArguments, training_args, model_args, command: str, *, any_schema: bool = False
) -> RunInputs:
    """Every name checked (model, datasets, output directory, checkpoint) before anything slow is loaded, then
    the datasets; ``training_args.model_init_kwargs`` filled from ``model_args`` as TRL's scripts do.
    ``any_schema``: datasets need not be ECHO trajectory datasets (``echo-trl sft`` takes any SFT dataset)."""
    from ...data.hub import locate
    from ...data.store import saved_dataset_kind
    from ...io.outputs import check_output_dir
    from .checkpoints import resolve_checkpoint
    from .loading import check_model_dir

    if not model_args.model_name_or_path:
        raise EchoTrlError(f"--model_name_or_path is required (`echo-trl {command} --help`)")
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
            locate(name, what)
    check_model_dir(model_args.model_name_or_path, "--model_name_or_path")  # a local one holds a model
    if getattr(training_args, "chat_template_path", None):  # readable, before TRL's loader would raise
        from ...tokens.template.chat_template import read_chat_template

        read_chat_template(training_args.chat_template_path, trust_remote_code=training_args.trust_remote_code)
    check_output_dir(training_args.output_dir, flag="--output_dir")  # a file or read-only: before the work
    checkpoint = resolve_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    train_dataset = load_split(script_args.dataset_name, script_args.dataset_train_split, any_schema=any_schema)
    eval_dataset = None
    if evaluating:
        if script_args.eval_dataset_name:
            eval_dataset = load_split(
                script_args.eval_dataset_name, script_args.dataset_test_split, any_schema=any_schema
            )
        elif saved_dataset_kind(script_args.dataset_name) == "dataset":
            raise EchoTrlError(
                f"{script_args.dataset_name} is a single-split dataset directory: pass the held-out "
                "trajectories with --eval_dataset_name DIR"
            )
        else:
            eval_dataset = load_split(script_args.dataset_name, script_args.dataset_test_split, any_schema=any_schema)
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    return RunInputs(train_dataset, eval_dataset, checkpoint)


def build_trainer(trainer_class, inputs: RunInputs, training_args, model_args):
    """``trainer_class`` (EchoGRPOTrainer or EchoSFTTrainer) the way TRL's scripts build theirs: the model by
    name, quantization and PEFT from ``model_args``."""
    from trl import get_peft_config, get_quantization_config

    return trainer_class(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=inputs.train_dataset,
        eval_dataset=inputs.eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )


def load_split(name: str, split: str, *, any_schema: bool = False):
    """One split of a trajectory dataset (any dataset with ``any_schema``), a missing split as one line."""
    from .loading import load_dataset_named

    try:
        return load_dataset_named(name, split=split, any_schema=any_schema)
    except (KeyError, ValueError) as exc:
        if "split" in str(exc).lower() or isinstance(exc, KeyError):
            raise EchoTrlError(f"{name}: no split {split!r} ({exc})") from None
        raise


def train_and_save(trainer, checkpoint: str | None, output_dir: str) -> None:
    """Train (resuming from ``checkpoint``), then ``save_state()`` and ``save_model()``; a full disk is one line
    and leaves no cut checkpoint."""
    from .checkpoints import checkpoint_saves

    with checkpoint_saves(output_dir, trainer.model):
        trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_state()
        trainer.save_model(output_dir)


def finish(trainer, output_dir: str) -> None:
    """The closing line, the trackers finished, and no rank leaving the group while another still saves."""
    trainer.accelerator.print(f"model and trainer_state.json saved to {output_dir}")
    for tracker in trainer.accelerator.trackers:
        tracker.finish()
    trainer.accelerator.wait_for_everyone()
