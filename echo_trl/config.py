"""``EchoGRPOConfig``: TRL's ``GRPOConfig`` plus the ECHO world-model settings.

    L = L_GRPO(action tokens) + world_model_coeff * CE(env_output tokens)

Every field is also a command-line flag of ``echo-trl train`` (TRL's ``TrlParser`` reads the
``help`` metadata), and a key of its ``--config`` YAML.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

from .errors import EchoTrlError
from .roles import WORLD_LOSS_TARGETS
from .tokens.size_limit import DEFAULT_MAX_RENDERED_CHARS

#: Shapes of the world-model coefficient over training steps.
COEFF_SCHEDULES = ("constant", "linear_decay", "step_decay")

#: TRL's own default ``max_completion_length`` (read from TRL): what online generation gets when it is unset.
TRL_MAX_COMPLETION_LENGTH: int = GRPOConfig.__dataclass_fields__["max_completion_length"].default

#: How the world-model cross-entropy is averaged (see ``world_loss_normalization``).
WORLD_LOSS_NORMALIZATIONS = ("token", "sequence", "all_sequences")

#: What stands in for the behaviour policy of offline rows without recorded log-probs (see ``behavior_policy``).
BEHAVIOR_POLICIES = ("initial", "current")

#: Above this lambda the paper saw the agent collapse onto dull, predictable commands.
COEFF_WARNING_THRESHOLD = 0.1


class EchoConfigError(ValueError):
    """Impossible ECHO settings (a ``ValueError``, as TRL's own config checks raise)."""


@dataclass
class EchoGRPOConfig(GRPOConfig):
    r"""
    Configuration class for the [`EchoGRPOTrainer`]: every [`~trl.GRPOConfig`] field plus the ECHO ones below.

    ECHO adds `world_model_coeff * CE(env_output tokens)` to GRPO's loss, computed from the per-token
    log-probabilities of GRPO's own forward pass (no second forward). The world term sits outside
    GRPO's clipping, importance sampling and KL: it is plain teacher-forced cross-entropy on what the
    environment said.

    Using [`~transformers.HfArgumentParser`] (TRL's `TrlParser`, as `echo-trl train` does) every field is also a
    command-line flag and a key of a `--config` YAML recipe.

    The groups below say which settings belong together: `world_model_coeff*` (how much the world term weighs),
    `world_loss_*` (which tokens and how the cross-entropy is computed), `wm_filter_min_*` (which rollouts it
    learns from) and `max_world_model_tokens` (how many tokens of each observation).

    Parameters:
        > Parameters that control the weight of the world term (lambda)

        world_model_coeff (`float`, *optional*, defaults to `0.05`):
            Lambda: weight of the world-model cross-entropy on environment-output tokens. `0.0` gives plain GRPO
            (bit for bit). The paper recommends about 0.05; at 0.2 it saw collapse, so values above 0.1 warn.
        world_model_coeff_schedule (`str`, *optional*, defaults to `"constant"`):
            How lambda changes with the optimizer step: `"constant"`, `"linear_decay"` or `"step_decay"`.
        world_model_coeff_end (`float`, *optional*, defaults to `0.0`):
            Final lambda of the `"linear_decay"` schedule.
        world_model_coeff_steps (`list[int]` or `None`, *optional*):
            `"linear_decay"`: one value, the steps to reach `world_model_coeff_end` (default: the whole run).
            `"step_decay"`: strictly increasing steps at which lambda switches to `world_model_coeff_values`.
        world_model_coeff_values (`list[float]` or `None`, *optional*):
            `"step_decay"` only: lambda from each `world_model_coeff_steps` entry on.

        > Parameters that control what the world term trains on and how

        max_completion_length (`int` or `None`, *optional*, defaults to `None`):
            Completion tokens kept. `None`: offline, each recorded completion whole, bounded by the model's
            context length (TRL's default would cut recorded AWM episodes silently); online, TRL's default.

        world_loss_target (`str`, *optional*, defaults to `"env_only"`):
            `"env_only"` (tool output content), `"observation"` (plus the chat-template tokens wrapping tool
            messages) or `"all"` (plus harness warnings).
        world_loss_normalization (`str`, *optional*, defaults to `"sequence"`):
            `"sequence"`: each trajectory's mean CE over its own world tokens, averaged over the trajectories that
            have any (every trajectory weighs the same); `"all_sequences"` (echo-rl's): the same means divided by
            the number of all trajectories of the batch (rows without world tokens count as 0); `"token"`: the CE
            summed over all world tokens / their number (every token weighs the same). Exact under data
            parallelism, and under gradient accumulation when `steps_per_generation ==
            gradient_accumulation_steps` (TRL's default).
        world_loss_temperature (`float`, *optional*, defaults to `1.0`):
            Temperature of the world-model cross-entropy. TRL divides the logits by `temperature` in its
            forward: when the two are equal (TRL's default of 1.0 included) the world term reuses GRPO's
            log-probs as they are; otherwise the hidden states of that same forward are projected once more
            through the LM head at `world_loss_temperature`, for the env tokens only (no second backbone forward).
            The held-out `eval_world/ce_env` is always at temperature 1, whatever the two temperatures.
        use_policy_loss (`bool`, *optional*, defaults to `True`):
            Whether to train the GRPO term. `False` is verifier-free ECHO: only the world term trains.

        > Parameters that control which rollouts and tokens the world term learns from

        wm_filter_min_valid_tool_call_pct (`float`, *optional*, defaults to `0.0`):
            Skip a trajectory's world tokens unless at least this percentage of its assistant turns call an
            offered tool (0 = off). The filters gate only the world term.
        wm_filter_min_parse_clean_pct (`float`, *optional*, defaults to `0.0`):
            Likewise for assistant turns that parsed into a tool call and drew no harness warning.
        wm_filter_min_correct_pct (`float`, *optional*, defaults to `0.0`):
            Likewise for tool calls that got a non-error result.
        max_world_model_tokens (`int` or `None`, *optional*):
            At most this many world-target tokens (the first ones) of each observation: the environment's reply
            to one agent turn, i.e. everything between two assistant turns (all tool messages of a parallel call
            together). The same offline and online (`echo_trl.tokens.world_mask`). `None` = all.

        > Parameters that control the speed of the offline forward (never its numbers)

        prefix_sharing (`bool`, *optional*, defaults to `True`):
            Forward the common prefixes of a micro-batch once (a group's prompt, a scenario's tool preamble),
            with every suffix attending to them (`echo_trl.prefix.attention`): the same log-probs, losses and
            gradients as the unshared forward, offline and online. A group's rows stay in one micro-batch
            (offline: still each trajectory once per epoch). Refused in one line for models it cannot reproduce
            (sliding window, soft-capping, no rotary embeddings, multimodal: see docs/prefix_sharing.md).
        prefix_sharing_min_tokens (`int`, *optional*, defaults to `64`):
            Shorter common prefixes are forwarded per row (sharing them costs more than it saves).

        > Parameters that control the rendering

        chat_template_path (`str` or `None`, *optional*):
            Render (and, online, generate) with this chat template instead of the tokenizer's: a `.jinja` file or a
            tokenizer (directory or Hub id) to take it from, as TRL's `SFTConfig.chat_template_path` (TRL 1.16's
            `GRPOConfig` has no such field). It enters the token cache's key and the model card.

        > Parameters that control the behaviour policy offline

        behavior_policy (`str`, *optional*, defaults to `"initial"`):
            Offline, what the importance ratio of a recorded trajectory without `behavior_logprobs` divides by.
            `"initial"`: the starting model's log-probs, computed once per run (one no-gradient forward per
            trajectory, cached with the tokenized dataset; `echo_trl.train.offline.behavior`), so GRPO's clipping
            bounds how far training moves the policy from the model that (usually) recorded the episodes.
            `"current"`: the policy at each update (importance ratio 1 at every step: clipping never binds across
            steps). Rows that carry `behavior_logprobs` always use them. docs/benchmarks.md compares the two.
    """

    world_model_coeff: float = field(
        default=0.05,
        metadata={
            "help": "Lambda: weight of the world-model cross-entropy on environment-output tokens. 0 gives "
            "plain GRPO. The paper recommends about 0.05; at 0.2 it saw collapse (the agent learns to issue "
            "dull commands whose output is easy to predict), so values above 0.1 warn."
        },
    )
    world_model_coeff_schedule: str = field(
        default="constant",
        metadata={
            "help": "How lambda changes with the optimizer step: 'constant'; 'linear_decay' (from "
            "world_model_coeff to world_model_coeff_end over world_model_coeff_steps[0] steps, or the whole "
            "run when unset); 'step_decay' (world_model_coeff until world_model_coeff_steps[0], then "
            "world_model_coeff_values[i] from world_model_coeff_steps[i] on).",
            "choices": list(COEFF_SCHEDULES),
        },
    )
    world_model_coeff_end: float = field(
        default=0.0,
        metadata={"help": "Final lambda of the 'linear_decay' schedule."},
    )
    world_model_coeff_steps: list[int] | None = field(
        default=None,
        metadata={
            "help": "'linear_decay': one value, the number of steps to reach world_model_coeff_end. "
            "'step_decay': strictly increasing steps at which lambda switches to the matching "
            "world_model_coeff_values entry."
        },
    )
    world_model_coeff_values: list[float] | None = field(
        default=None,
        metadata={"help": "'step_decay' only: lambda from each world_model_coeff_steps entry on."},
    )
    max_completion_length: int | None = field(
        default=None,
        metadata={
            "help": "Completion tokens kept. Unset (default): offline, each recorded completion whole, bounded "
            "by the model's context length (recorded AWM episodes run to thousands of tokens; TRL's default "
            f"of {TRL_MAX_COMPLETION_LENGTH} would silently cut most of their env output); online, TRL's "
            f"{TRL_MAX_COMPLETION_LENGTH} generated tokens. Recorded completions are cut at message ends."
        },
    )
    world_loss_target: str = field(
        default="env_only",
        metadata={
            "help": "Tokens the world-model loss trains on: 'env_only' (tool output content), 'observation' "
            "(plus the chat-template tokens wrapping tool messages), 'all' (plus harness warnings).",
            "choices": list(WORLD_LOSS_TARGETS),
        },
    )
    world_loss_normalization: str = field(
        default="sequence",
        metadata={
            "help": "How the world-model cross-entropy (CE) of a batch is averaged. 'sequence' (default): each "
            "trajectory's mean CE over its own world tokens, averaged over the trajectories that have at least "
            "one (sum of the means / number of such trajectories): every trajectory weighs the same, and one "
            "the filters or a tool-free episode leave without world tokens does not dilute lambda. "
            "'all_sequences' (echo-rl's exact setting): the same per-trajectory means divided by the number of "
            "all trajectories of the batch: rows without world tokens count as 0 and shrink the term. 'token': "
            "the CE summed over all world tokens of the batch / their number: every token weighs the same, so "
            "long observations weigh more. Each count is gathered over the generation batch and all processes "
            "(as TRL normalizes its 'dapo' loss): exact under gradient accumulation when "
            "steps_per_generation == gradient_accumulation_steps.",
            "choices": list(WORLD_LOSS_NORMALIZATIONS),
        },
    )
    world_loss_temperature: float = field(
        default=1.0,
        metadata={
            "help": "Temperature of the world-model cross-entropy. 1.0 (default) is true cross-entropy, the "
            "quantity the held-out env CE measures. TRL divides logits by `temperature` in its forward: when "
            "the two are equal the world term reuses those log-probs; otherwise the env-token hidden states of "
            "the same forward are projected through the LM head once more (no second backbone forward). The held-out "
            "eval_world/ce_env is always at temperature 1."
        },
    )
    use_policy_loss: bool = field(
        default=True,
        metadata={
            "help": "Whether to train the GRPO policy term. False = verifier-free ECHO: only the world-model "
            "loss trains (rewards and advantages are ignored)."
        },
    )
    wm_filter_min_valid_tool_call_pct: float = field(
        default=0.0,
        metadata={
            "help": "Rollout filter for the world term only (0-100, 0 = off): skip the env tokens of a trajectory "
            "unless at least this percentage of its assistant turns call a tool the trajectory offers."
        },
    )
    wm_filter_min_parse_clean_pct: float = field(
        default=0.0,
        metadata={
            "help": "Rollout filter for the world term only (0-100, 0 = off): skip the env tokens of a trajectory "
            "unless at least this percentage of its assistant turns parsed into a tool call and drew no "
            "harness warning."
        },
    )
    wm_filter_min_correct_pct: float = field(
        default=0.0,
        metadata={
            "help": "Rollout filter for the world term only (0-100, 0 = off): skip the env tokens of a trajectory "
            "unless at least this percentage of its tool calls got a non-error result."
        },
    )
    max_world_model_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Train the world term on at most this many world-target tokens of each observation, the first "
            "ones. An observation is the environment's reply to one agent turn: everything between two "
            "assistant turns (all tool messages of a parallel call together), offline and online alike. "
            "None = all."
        },
    )
    prefix_sharing: bool = field(
        default=True,
        metadata={
            "help": "Forward a micro-batch's common prefixes (a group's prompt, a scenario's tool preamble) once, "
            "offline and online; exactly the same log-probs, losses and gradients. A group's rows stay in one "
            "micro-batch. Refused in one line where it cannot be exact (see docs/prefix_sharing.md)."
        },
    )
    prefix_sharing_min_tokens: int = field(
        default=64,
        metadata={"help": "Common prefixes shorter than this many tokens are forwarded per row (prefix_sharing)."},
    )

    behavior_policy: str = field(
        default="initial",
        metadata={
            "help": "Offline, for trajectories without behavior_logprobs: the importance ratio's behaviour "
            "policy. 'initial': the starting model (its log-probs computed once per run, cached), so clipping "
            "bounds the drift from it; 'current': the policy at each update (ratio 1, clipping never binds "
            "across steps). Recorded behavior_logprobs are always used where present; docs/benchmarks.md "
            "compares the two.",
            "choices": list(BEHAVIOR_POLICIES),
        },
    )

    chat_template_path: str | None = field(
        default=None,
        metadata={
            "help": "Render (and, online, generate) with this chat template instead of the tokenizer's: a .jinja "
            "file, or a tokenizer (local directory or Hub id) to take its template from, as TRL's "
            "SFTConfig.chat_template_path. A template taken from a tokenizer must not need special tokens this "
            "vocabulary lacks (a .jinja file renders them as text)."
        },
    )
    max_rendered_chars: int | None = field(
        default=DEFAULT_MAX_RENDERED_CHARS,
        metadata={
            "help": "Refuse (one line naming the row) a trajectory whose text rendered by the chat template is "
            "longer than this many characters: tokenizer memory grows with it (a 50 MB tool output needs many "
            "GB). The default is far beyond any context window. None = no bound."
        },
    )

    def __post_init__(self):
        check_batch_sizes(self)  # before TRL's, which computes with them
        super().__post_init__()
        validate_echo_settings(self)


#: Training arguments that count something and must be at least 1 (0 fails deep inside the Trainer).
POSITIVE_COUNTS = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")


def check_batch_sizes(args) -> None:
    """Raise :class:`EchoConfigError` for a batch size or accumulation count below 1."""
    for name in POSITIVE_COUNTS:
        value = getattr(args, name, 1)
        if not isinstance(value, int) or value < 1:
            raise EchoConfigError(f"{name} must be >= 1, got {value!r}")


def validate_echo_settings(args) -> None:
    """Raise :class:`EchoConfigError` for impossible ECHO settings; warn above lambda = 0.1."""

    def bad(msg: str) -> None:
        raise EchoConfigError(msg)

    def finite_nonneg(name: str, value) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            bad(f"{name} must be a finite number >= 0, got {value!r}")

    finite_nonneg("world_model_coeff", args.world_model_coeff)
    finite_nonneg("world_model_coeff_end", args.world_model_coeff_end)
    if args.world_model_coeff_schedule not in COEFF_SCHEDULES:
        bad(
            f"world_model_coeff_schedule must be one of {', '.join(COEFF_SCHEDULES)}, "
            f"got {args.world_model_coeff_schedule!r}"
        )
    steps, values = args.world_model_coeff_steps, args.world_model_coeff_values
    if args.world_model_coeff_schedule == "linear_decay":
        if steps is not None and (len(steps) != 1 or steps[0] <= 0):
            bad(
                f"linear_decay takes one world_model_coeff_steps value > 0 (steps to reach world_model_coeff_end), "
                f"got {steps}"
            )
        if values is not None:
            bad("world_model_coeff_values is only used by world_model_coeff_schedule='step_decay'")
    elif args.world_model_coeff_schedule == "step_decay":
        if not steps or not values or len(steps) != len(values):
            bad(
                "step_decay needs world_model_coeff_steps and world_model_coeff_values of the same, non-zero length, "
                f"got steps={steps} values={values}"
            )
        if any(s <= 0 for s in steps) or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            bad(f"world_model_coeff_steps must be positive and strictly increasing, got {steps}")
        for i, v in enumerate(values):
            finite_nonneg(f"world_model_coeff_values[{i}]", v)
    elif steps is not None or values is not None:
        bad(
            "world_model_coeff_steps / world_model_coeff_values need world_model_coeff_schedule "
            "'linear_decay' or 'step_decay'"
        )
    if args.world_loss_target not in WORLD_LOSS_TARGETS:
        bad(f"world_loss_target must be one of {', '.join(WORLD_LOSS_TARGETS)}, got {args.world_loss_target!r}")
    if args.world_loss_normalization not in WORLD_LOSS_NORMALIZATIONS:
        bad(
            f"world_loss_normalization must be one of {', '.join(WORLD_LOSS_NORMALIZATIONS)}, "
            f"got {args.world_loss_normalization!r}"
        )
    t = args.world_loss_temperature
    if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        bad(f"world_loss_temperature must be a finite number > 0, got {t!r}")
    for name in ("wm_filter_min_valid_tool_call_pct", "wm_filter_min_parse_clean_pct", "wm_filter_min_correct_pct"):
        v = getattr(args, name)
        if not isinstance(v, (int, float)) or not 0 <= v <= 100:
            bad(f"{name} is a percentage in [0, 100], got {v!r}")
    if args.max_world_model_tokens is not None and args.max_world_model_tokens <= 0:
        bad(f"max_world_model_tokens must be > 0 (or None for all), got {args.max_world_model_tokens}")
    limit = args.max_rendered_chars
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        bad(f"max_rendered_chars must be a positive number of characters (or None), got {limit!r}")
    if args.behavior_policy not in BEHAVIOR_POLICIES:
        bad(f"behavior_policy must be one of {', '.join(BEHAVIOR_POLICIES)}, got {args.behavior_policy!r}")
    peak = max([args.world_model_coeff, *(values or [])])
    if not args.use_policy_loss and peak == 0:
        bad("use_policy_loss=False with world_model_coeff=0 leaves nothing to train")
    if peak > COEFF_WARNING_THRESHOLD:
        warnings.warn(
            f"world_model_coeff up to {peak} > {COEFF_WARNING_THRESHOLD}: the ECHO paper saw collapse at 0.2 (the "
            "agent learns to issue dull commands whose output is easy to predict). About 0.05 is recommended.",
            UserWarning,
            stacklevel=3,
        )


def config_for(model, args) -> EchoGRPOConfig:
    """``args``, or TRL's default for ``model`` (``<name>-ECHO``, as ``GRPOTrainer`` names ``<name>-GRPO``); anything
    but an ``EchoGRPOConfig`` is refused (TRL's ``GRPOConfig`` lacks ECHO's fields)."""
    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
        return EchoGRPOConfig(f"{str(name).split('/')[-1]}-ECHO")
    if not isinstance(args, EchoGRPOConfig):
        raise EchoTrlError(f"EchoGRPOTrainer needs an EchoGRPOConfig, got {type(args).__name__}")
    return args
