"""``EchoSFTConfig``: TRL's ``SFTConfig`` plus the role weights of ECHO's SFT stage.

Every ``SFTConfig`` field keeps TRL's meaning and default. The fields below weight tokens by role where the rows
have roles (conversations with tool messages, ECHO trajectory datasets); a dataset without them trains exactly as
``SFTTrainer`` does::

    loss = sum_t w_t * CE_t / sum_t w_t
    w_t  = observation_weight on tool-message content, action_weight x TRL's mask on the assistant's tokens,
           TRL's mask (1 / 0) elsewhere

Every field is also a command-line flag of ``echo-trl sft`` (TRL's ``TrlParser`` reads the ``help`` metadata),
and a key of its ``--config`` YAML.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from transformers import TrainingArguments
from trl import SFTConfig

from .config import EchoConfigError
from .roles import WORLD_LOSS_TARGETS


@dataclass
class EchoSFTConfig(SFTConfig):
    r"""
    Configuration class for the [`EchoSFTTrainer`]: every [`~trl.SFTConfig`] field (TRL's defaults) plus the ones
    below.

    Supervised fine-tuning that also supervises the environment's observations (ActObs): in a conversation with tool
    messages, their content is trained with `observation_weight`, whatever TRL's masks say about it (so
    `assistant_only_loss=True` trains the assistant's turns and the observations); the assistant's tokens TRL trains
    get `action_weight`; every other token keeps TRL's mask. The loss is the weighted mean over the accumulation window
    and processes (exact under gradient accumulation and data parallelism). Rows without roles (plain text, no tool
    turns) train exactly as with `SFTConfig`.

    Parameters:
        > Parameters that weight the tokens by role

        observation_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the tool-message content tokens (observation supervision, ActObs). `0.0` leaves observations out
            (the action-only SFT of agent recipes); `1.0` supervises them like any other trained token.
        action_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the assistant's tokens that TRL's masks train (tool calls, text, end-of-turn).
        world_loss_target (`str`, *optional*, defaults to `"env_only"`):
            Which tokens `observation_weight` weighs, as in `EchoGRPOConfig`: `"env_only"` (tool output content),
            `"observation"` (plus the template tokens wrapping tool messages), `"all"` (plus harness warnings).
        max_world_model_tokens (`int` or `None`, *optional*):
            At most this many observation tokens of each observation (the first ones) get `observation_weight`; the
            rest are not trained. `None`: all.
        world_model_coeff (`float` or `None`, *optional*):
            Deprecated name of `observation_weight` (in `EchoGRPOConfig` the same name is ECHO's lambda, another
            meaning); still accepted, with a warning.

        > Parameters of ECHO trajectory datasets (`echo-trl build-dataset`)

        max_completion_length (`int` or `None`, *optional*):
            Completion tokens kept of each trajectory, cut at message ends (as `echo-trl train` does), before TRL's
            `max_length` truncation. `None`: each recorded completion whole.
        min_reward (`float` or `None`, *optional*):
            Train only the episodes (rows) whose `reward` column is at least this (AWM: 1.0 = completed). `None`
            (default): every row.
        world_all_episodes (`bool`, *optional*, defaults to `False`):
            With `min_reward`: keep every episode; the filtered-out ones train their observation tokens only.
    """

    observation_weight: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the tool-message content tokens (observation supervision, ActObs). 0 = observations "
            "not trained (action-only SFT); 1 (default) = trained like any other token."
        },
    )
    action_weight: float = field(
        default=1.0, metadata={"help": "Weight of the assistant's tokens TRL's masks train (tool calls, text)."}
    )
    world_loss_target: str = field(
        default="env_only",
        metadata={
            "help": "Tokens observation_weight weighs: 'env_only' (tool output content), 'observation' (plus the "
            "template tokens wrapping tool messages), 'all' (plus harness warnings).",
            "choices": list(WORLD_LOSS_TARGETS),
        },
    )
    max_world_model_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Observation tokens weighted per observation (the first ones; the rest untrained); None = all."
        },
    )
    world_model_coeff: float | None = field(
        default=None,
        metadata={"help": "Deprecated name of --observation_weight (accepted with a warning)."},
    )
    max_completion_length: int | None = field(
        default=None,
        metadata={
            "help": "ECHO trajectory datasets: completion tokens kept, cut at message ends, before TRL's max_length; "
            "None = each recorded completion whole."
        },
    )
    min_reward: float | None = field(
        default=None,
        metadata={
            "help": "Train only rows whose reward column is >= this (AWM: 1.0 = completed, 0.1 = incomplete); rows "
            "without a reward do not qualify. None (default) = all rows."
        },
    )
    world_all_episodes: bool = field(
        default=False,
        metadata={"help": "With --min_reward: keep every row; the filtered-out ones train their observations only."},
    )

    def __post_init__(self):
        super().__post_init__()
        if self.world_model_coeff is not None:
            warnings.warn(
                "EchoSFTConfig.world_model_coeff is deprecated: use observation_weight (the SFT weight of the "
                "observation tokens; world_model_coeff is ECHO-GRPO's lambda)",
                FutureWarning,
                stacklevel=3,
            )
            if self.observation_weight not in (1.0, self.world_model_coeff):
                raise EchoConfigError(
                    f"world_model_coeff={self.world_model_coeff!r} and observation_weight={self.observation_weight!r}"
                    " are one setting under two names: give observation_weight only"
                )
            self.observation_weight, self.world_model_coeff = self.world_model_coeff, None
        validate_sft_settings(self)


def as_echo_sft_config(args, model) -> EchoSFTConfig:
    """The trainer's ``args`` as an :class:`EchoSFTConfig`: TRL's default for ``None`` (named after the model), and a
    ``TrainingArguments`` / ``SFTConfig`` converted field by field as ``SFTTrainer`` converts a ``TrainingArguments``
    (the ECHO fields at their defaults)."""
    if isinstance(args, EchoSFTConfig):
        return args
    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", None) or "model"
        return EchoSFTConfig(f"{str(name).split('/')[-1]}-SFT")
    if isinstance(args, TrainingArguments):
        values = args.to_dict()
        values.update({k: getattr(args, k) for k in values if k.endswith("_token")})  # to_dict hides them
        return EchoSFTConfig(**values)
    return args


def validate_sft_settings(args) -> None:
    """Raise :class:`EchoConfigError` (one line) for role weights the SFT stage cannot train with."""

    def bad(msg: str) -> None:
        raise EchoConfigError(msg)

    for name in ("action_weight", "observation_weight"):
        v = getattr(args, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            bad(f"{name} must be a finite number >= 0, got {v!r}")
    if args.world_loss_target not in WORLD_LOSS_TARGETS:
        bad(f"world_loss_target must be one of {', '.join(WORLD_LOSS_TARGETS)}, got {args.world_loss_target!r}")
    if args.max_world_model_tokens is not None and args.max_world_model_tokens <= 0:
        bad(f"max_world_model_tokens must be > 0 (or None for all), got {args.max_world_model_tokens}")
    if args.max_completion_length is not None and args.max_completion_length <= 0:
        bad(f"max_completion_length must be > 0 (or None for whole completions), got {args.max_completion_length}")
    if args.min_reward is not None and not math.isfinite(args.min_reward):
        bad(f"min_reward must be a finite number, got {args.min_reward!r}")
    if args.world_all_episodes and args.min_reward is None:
        bad("world_all_episodes needs min_reward (it keeps the episodes min_reward would drop)")
