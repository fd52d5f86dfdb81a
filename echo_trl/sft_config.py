"""``EchoSFTConfig``: TRL's ``SFTConfig`` plus the role weights of ECHO's SFT stage.

    loss = sum_t w_t * CE_t / sum_t w_t,   w_t = action_weight (action), world_model_coeff (env_output), 0 (rest)

Every field is also a command-line flag of ``echo-trl sft`` (TRL's ``TrlParser`` reads the ``help`` metadata),
and a key of its ``--config`` YAML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trl import SFTConfig

from .config import EchoConfigError
from .roles import WORLD_LOSS_TARGETS


@dataclass
class EchoSFTConfig(SFTConfig):
    r"""
    Configuration class for the [`EchoSFTTrainer`]: every [`~trl.SFTConfig`] field plus the ones below.

    Supervised fine-tuning on recorded trajectories (the same datasets as `EchoGRPOTrainer`) that also supervises
    the observation tokens: per-token cross-entropy weighted by role, divided by the weight sum (exact under
    gradient accumulation and several processes).

    Parameters:
        > Parameters that weight the tokens by role

        action_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the agent's own tokens (tool calls, text, end-of-turn).
        world_model_coeff (`float`, *optional*, defaults to `1.0`):
            Weight of the environment-output tokens (ActObs: observation supervision). `0.0` is TRL's SFT on the
            action tokens alone; `1.0` (the default) supervises observations exactly as actions, the plain language
            modelling loss on both that "don't mask the environment" names (echo_trl's choice of default).
        world_loss_target (`str`, *optional*, defaults to `"env_only"`):
            Which tokens `world_model_coeff` weighs, as in `EchoGRPOConfig`.
        max_world_model_tokens (`int` or `None`, *optional*):
            At most this many world-target tokens of each observation (the first ones), as in `EchoGRPOConfig`.
        max_completion_length (`int` or `None`, *optional*):
            Completion tokens kept, cut at message ends. `None`: each recorded completion whole.
        max_length (`int` or `None`, *optional*):
            Prompt + completion tokens kept, cut at message ends. `None` (unlike TRL's 1024): the model's context
            length.

        > Parameters that pick the episodes

        min_reward (`float` or `None`, *optional*):
            Train the action tokens only of episodes whose recorded reward is at least this (AWM: 1.0 = completed).
            `None` (default): every episode.
        world_all_episodes (`bool`, *optional*, defaults to `False`):
            With `min_reward`: keep every episode, the filtered-out ones with action weight 0 (their observations
            still train the world term).
    """

    action_weight: float = field(default=1.0, metadata={"help": "Weight of the agent's action tokens in the SFT CE."})
    world_model_coeff: float = field(
        default=1.0,
        metadata={
            "help": "Weight of the environment-output tokens in the SFT CE (observation supervision, ActObs). "
            "0 = TRL's SFT on the action tokens only; 1 (default, echo_trl's choice) = observations supervised "
            "exactly as actions, the plain LM loss on both."
        },
    )
    world_loss_target: str = field(
        default="env_only",
        metadata={
            "help": "Tokens world_model_coeff weighs: 'env_only' (tool output content), 'observation' (plus the "
            "template tokens wrapping tool messages), 'all' (plus harness warnings).",
            "choices": list(WORLD_LOSS_TARGETS),
        },
    )
    max_world_model_tokens: int | None = field(
        default=None,
        metadata={"help": "World-target tokens kept per observation (the first ones); None = all."},
    )
    max_completion_length: int | None = field(
        default=None,
        metadata={"help": "Completion tokens kept, cut at message ends; None = each recorded completion whole."},
    )
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "Prompt + completion tokens kept, cut at message ends; None (default, unlike TRL's 1024) = the "
            "model's context length."
        },
    )
    min_reward: float | None = field(
        default=None,
        metadata={
            "help": "Train the action tokens only of episodes with recorded reward >= this (AWM: 1.0 = completed, "
            "0.1 = incomplete); episodes without a reward do not qualify. None (default) = all episodes."
        },
    )
    world_all_episodes: bool = field(
        default=False,
        metadata={
            "help": "With --min_reward: keep every episode for the world term; the filtered-out ones train no "
            "action token (action weight 0)."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        validate_sft_settings(self)


def validate_sft_settings(args) -> None:
    """Raise :class:`EchoConfigError` (one line) for settings the SFT stage cannot train with exactly."""

    def bad(msg: str) -> None:
        raise EchoConfigError(msg)

    for name in ("action_weight", "world_model_coeff"):
        v = getattr(args, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            bad(f"{name} must be a finite number >= 0, got {v!r}")
    if args.action_weight == 0 and args.world_model_coeff == 0:
        bad("action_weight=0 with world_model_coeff=0 leaves nothing to train")
    if args.world_loss_target not in WORLD_LOSS_TARGETS:
        bad(f"world_loss_target must be one of {', '.join(WORLD_LOSS_TARGETS)}, got {args.world_loss_target!r}")
    if args.max_world_model_tokens is not None and args.max_world_model_tokens <= 0:
        bad(f"max_world_model_tokens must be > 0 (or None for all), got {args.max_world_model_tokens}")
    if args.min_reward is not None and not math.isfinite(args.min_reward):
        bad(f"min_reward must be a finite number, got {args.min_reward!r}")
    if args.world_all_episodes and args.min_reward is None:
        bad("world_all_episodes needs min_reward (it keeps the episodes min_reward would drop)")
    if args.packing or args.padding_free:
        bad(
            "packing / padding_free are not supported: TRL packs through its own dataset preparation, which "
            "the role-weighted trajectories bypass; train one trajectory per row"
        )
    if args.assistant_only_loss or args.completion_only_loss:
        bad(
            "assistant_only_loss / completion_only_loss do not apply: the tokens trained are set by action_weight "
            "and world_model_coeff (from echo_trl's role masks)"
        )
    if args.loss_type != "nll" or args.label_smoothing_factor > 0:
        bad("EchoSFTConfig trains the weighted cross-entropy: loss_type must be 'nll', label_smoothing_factor 0")
