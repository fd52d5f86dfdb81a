"""The options of ``echo-trl train --demo``: a dataclass whose training options are ``EchoGRPOConfig``'s own fields.

An option that is a config field (``world_model_coeff``, ``behavior_policy``, ``max_steps`` ...) is declared with
:func:`config_option`: its help and choices are read from the config, its default too unless the demo needs its
own (a tiny model on a CPU: a few steps, a high learning rate), and :meth:`DemoArguments.run_config` passes it on
to both runs' configs. A default changed in the config is the demo's default; a new choice is the demo's choice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

from ..command_line import command_parser, parse_command
from ..config import EchoGRPOConfig
from ..help_pages import render
from .warmup import DEMO_THREADS, WARMUP_LEARNING_RATE, WARMUP_STEPS, WarmupSettings, warmup_steps_help

REPO_DATA = Path(__file__).resolve().parents[2] / "data" / "episodes"

_CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(EchoGRPOConfig)}

#: The demo's options that are ``EchoGRPOConfig`` fields, passed on to both runs (``world_model_coeff`` to the
#: ECHO run; the baseline's is 0).
RUN_OPTIONS = (
    "world_model_coeff",
    "behavior_policy",
    "max_steps",
    "learning_rate",
    "per_device_train_batch_size",
    "eval_steps",
    "max_completion_length",
    "seed",
)

#: What every demo run sets beyond its options: a short constant-rate CPU run, evaluated every ``eval_steps``,
#: that saves only at the end and prints nothing of its own (the demo prints its summary).
CPU_RUN = dict(
    lr_scheduler_type="constant",
    warmup_steps=0,
    per_device_eval_batch_size=2,
    num_generations=2,
    gradient_checkpointing=False,
    use_cpu=True,
    bf16=False,
    report_to="none",
    logging_steps=1,
    save_strategy="no",
    eval_strategy="steps",
    disable_tqdm=True,
)


def config_option(name: str, *, default: Any = MISSING, help: str | None = None) -> Any:
    """A demo option that is ``EchoGRPOConfig``'s field ``name``: the config's choices, and its default and help
    unless the demo gives its own (a default for a tiny model on a CPU, a help saying what it does here)."""
    source = _CONFIG_FIELDS[name]
    metadata = dict(source.metadata)
    if help is not None:
        metadata["help"] = help
    return field(default=source.default if default is MISSING else default, metadata=metadata)


@dataclass
class DemoArguments:
    """Options of ``echo-trl train --demo``: ECHO vs a lambda = 0 GRPO baseline on the same episodes.

    Parameters:
        > Parameters that control the data and the outputs

        output_dir (`str`, *optional*, defaults to `"outputs/echo-demo"`):
            Where the two runs' models, ``metrics.json`` and ``env_ce.png`` go.
        overwrite_output_dir (`bool`, *optional*, defaults to `False`):
            Replace the outputs of a previous demo run in ``output_dir`` (by default the demo refuses).
        data_dir (`str` or `None`, *optional*):
            AWM episode files or directories (default: the bundled ``data/episodes``, else a synthetic set).
        max_episodes (`int`, *optional*, defaults to `96`):
            Use at most this many episodes.
        keep_tool_schemas (`bool`, *optional*, defaults to `False`):
            Keep the full tool schemas in the prompt (by default only the tool names are rendered).
        model_cache_dir (`str` or `None`, *optional*):
            Where the tiny model is built once and reused.

        > Parameters of both runs: `EchoGRPOConfig` fields, with the config's meaning

        world_model_coeff, behavior_policy:
            The config's defaults (``world_model_coeff`` is the ECHO run's lambda; the baseline's is 0).
        max_steps, learning_rate, per_device_train_batch_size, eval_steps, max_completion_length, seed:
            The demo's own defaults: a tiny model trained for a few steps on a CPU.

        > Parameters of the shared warm-up (`echo_trl.demo.warmup`)

        warmup_steps (`int`, *optional*, defaults to `40`):
            Env-blind warm-up steps of the random-init tiny model before both runs; 0 skips it.
        warmup_learning_rate (`float`, *optional*, defaults to `3e-3`):
            Its learning rate.
        threads (`int`, *optional*, defaults to `1`):
            torch CPU threads of the warm-up and both runs (the printed numbers depend on it).
    """

    output_dir: str = field(
        default="outputs/echo-demo", metadata={"help": "where models, metrics.json and env_ce.png go"}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "replace the outputs of a previous demo run in OUTPUT_DIR (by default the demo refuses)"},
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "AWM episode files/dirs (default: the checkout's data/episodes when it holds episodes, "
            "else a synthetic AWM-style set written to OUTPUT_DIR/episodes)"
        },
    )
    max_episodes: int = field(default=96, metadata={"help": "use at most this many episodes (bundled data)"})
    keep_tool_schemas: bool = field(
        default=False,
        metadata={
            "help": "keep the full tool schemas in the prompt (AWM's are ~10k tokens: slow on CPU); by default "
            "only the tool names are rendered"
        },
    )
    model_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "where the tiny model is built once and reused (default: $ECHO_TRL_CACHE, else ~/.cache/echo_trl)"
        },
    )
    world_model_coeff: float = config_option("world_model_coeff")  # the ECHO run's; the baseline's is 0
    behavior_policy: str = config_option("behavior_policy")
    max_steps: int = config_option("max_steps", default=20, help="optimizer steps per run")
    learning_rate: float = config_option("learning_rate", default=2e-3, help="learning rate of both runs")
    per_device_train_batch_size: int = config_option(
        "per_device_train_batch_size", default=4, help="trajectories per optimizer step"
    )
    eval_steps: int = config_option("eval_steps", default=5, help="held-out env CE every this many steps (the plot)")
    max_completion_length: int = config_option(
        "max_completion_length", default=2048, help="completion tokens kept per trajectory"
    )
    seed: int = config_option("seed", default=0, help="seed of both runs, the episode sample and the warm-up")
    warmup_steps: int = field(default=WARMUP_STEPS, metadata={"help": warmup_steps_help("both runs")})
    warmup_learning_rate: float = field(default=WARMUP_LEARNING_RATE, metadata={"help": "warm-up learning rate"})
    threads: int = field(
        default=DEMO_THREADS,
        metadata={
            "help": "torch CPU threads of the warm-up and both runs (default 1: the tiny model gains nothing from "
            "more; the printed numbers are reproducible at the same count)"
        },
    )

    def run_config(self, output_dir: Path, world_model_coeff: float) -> EchoGRPOConfig:
        """The config of one run of the comparison: the options that are config fields, and :data:`CPU_RUN`."""
        options = {name: getattr(self, name) for name in RUN_OPTIONS}
        options.update(CPU_RUN, output_dir=str(output_dir), world_model_coeff=world_model_coeff)
        return EchoGRPOConfig(**options)

    def warmup_settings(self) -> WarmupSettings:
        """The shared warm-up, on the runs' batch size, completion length and seed."""
        return WarmupSettings(
            steps=self.warmup_steps,
            learning_rate=self.warmup_learning_rate,
            batch_size=self.per_device_train_batch_size,
            max_completion_length=self.max_completion_length,
            seed=self.seed,
            threads=self.threads,
        )


DESCRIPTION = """\
CPU demo: ECHO vs a lambda=0 GRPO baseline on the same AWM episodes, tiny local model.
Prints held-out env-token CE before/after for both; writes models, metrics.json and env_ce.png.
Options that are EchoGRPOConfig fields (world_model_coeff, behavior_policy, max_steps, ...) mean
what they mean in `echo-trl train`; both runs take them (the GRPO baseline with lambda = 0)."""


def demo_parser():
    return command_parser(
        "echo-trl train --demo",
        [DemoArguments],
        usage="echo-trl train --demo [--config YAML] [--output_dir DIR] [--data_dir DIR] [FLAGS...]",
        description=DESCRIPTION,
    )


def render_help() -> str:
    """``echo-trl train --demo --help``, rendered from the parser (stored in ``echo_trl/help/demo.txt`` and printed
    from there, so that ``--help`` loads no TRL: :mod:`echo_trl.help_pages`)."""
    return render(demo_parser())


def parse_demo_args(argv: list[str]) -> DemoArguments:
    """``echo-trl train --demo ARGV``'s options (a usage error is one line, exit 2)."""
    (options,) = parse_command(demo_parser(), argv)
    return options
