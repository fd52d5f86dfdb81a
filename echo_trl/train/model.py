"""The causal LM behind the training wrappers, and a second projection through its LM head.

TRL's forward returns log-probs at its sampling ``temperature``. Where ECHO needs them at another one
(``world_loss_temperature``, or the held-out CE at temperature 1), it re-projects the backbone's last
hidden states of that same forward through the LM head (:func:`logps_from_hidden`): no second backbone
forward. That reproduces the model's logits only for models that do not rescale them
(:func:`check_reprojection_supported`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

from ..errors import EchoTrlError

# Config attributes with which a model rescales its logits before the softmax; the second LM-head projection
# does not reproduce them, so it refuses such models.
LOGIT_RESCALING_ATTRS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)


def causal_lm(trainer_or_model):
    """The ``PreTrainedModel`` with the LM head (through accelerate / PEFT wrappers)."""
    model = trainer_or_model
    if hasattr(model, "accelerator") and hasattr(model, "model"):
        model = model.accelerator.unwrap_model(model.model)
    while hasattr(model, "module") and not hasattr(model, "get_output_embeddings"):  # DDP / DeepSpeed engine
        model = model.module
    if hasattr(model, "get_base_model"):  # PEFT
        model = model.get_base_model()
    return model


def context_length(model) -> int | None:
    """The model's context length (``max_position_embeddings``), or ``None`` when its config names none."""
    value = getattr(causal_lm(model).config.get_text_config(), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def weights_are_sharded(trainer) -> bool:
    """DeepSpeed ZeRO-3 or FSDP: at trainer init the model's weights are partitioned (or not yet placed), so it
    cannot be forwarded outside the training loop's wrapper."""
    return bool(is_deepspeed_zero3_enabled() or getattr(trainer, "is_fsdp_enabled", False))


def check_reprojection_supported(model, why: str, fix: str) -> None:
    """Raise if the second LM-head projection (needed because ``why``) cannot reproduce this model's logits."""
    config = causal_lm(model).config.get_text_config()
    found = [a for a in LOGIT_RESCALING_ATTRS if getattr(config, a, None) not in (None, 1.0)]
    if found:
        raise EchoTrlError(
            f"{why}, which re-projects hidden states through the LM head, but this model rescales "
            f"its logits ({', '.join(found)}); {fix}"
        )


def check_temperatures(model, *, temperature: float, world_loss_temperature: float, evaluates: bool) -> None:
    """At trainer init: refuse the temperatures whose log-probs need a re-projection this model cannot give
    (the world term at ``world_loss_temperature`` != TRL's ``temperature``; the held-out CE at 1)."""
    if not math.isclose(world_loss_temperature, temperature):
        check_reprojection_supported(
            model,
            "world_loss_temperature differs from temperature",
            "set them equal (the world term then reuses TRL's log-probs)",
        )
    if evaluates and not math.isclose(temperature, 1.0):
        check_reprojection_supported(model, "held-out CE is at temperature 1", "set temperature=1")


@contextmanager
def capture_hidden_states(model) -> Iterator[list[torch.Tensor]]:
    """Collect the backbone's ``last_hidden_state`` of every forward inside the block (TRL chunks by batch)."""
    backbone = causal_lm(model).base_model
    captured: list[torch.Tensor] = []

    def hook(_module, _args, output):
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None and isinstance(output, tuple):
            hidden = output[0]
        captured.append(hidden)

    handle = backbone.register_forward_hook(hook)
    try:
        yield captured
    finally:
        handle.remove()


def logps_at_temperature(
    model, hidden: torch.Tensor, labels: torch.Tensor, temperature: float, chunk_size: int = 1024
) -> torch.Tensor:
    """``log_softmax(lm_head(hidden) / temperature)[label]`` for rows of ``hidden`` (N, H), labels (N,).

    Chunked and checkpointed, so at most ``chunk_size`` x vocab logits live at once (also in backward).
    """
    head = causal_lm(model).get_output_embeddings()

    def score(h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = head(h).float() / temperature
        return torch.log_softmax(logits, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)

    if hidden.size(0) == 0:
        return hidden.sum(-1).float()  # empty, still connected
    out = []
    for start in range(0, hidden.size(0), chunk_size):
        h, y = hidden[start : start + chunk_size], labels[start : start + chunk_size]
        out.append(checkpoint(score, h, y, use_reentrant=False) if torch.is_grad_enabled() else score(h, y))
    return torch.cat(out)


def logps_from_hidden(
    model, hidden: torch.Tensor, completion_ids: torch.Tensor, need: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Per-completion-token log-probs at ``temperature`` (B, C) where ``need``, zeros elsewhere, from the hidden
    states (B, T, H) of a forward over prompt + completion whose last C positions are the completion."""
    hidden = hidden[:, -completion_ids.size(1) - 1 : -1]  # the position before each token predicts it
    values = logps_at_temperature(model, hidden[need], completion_ids[need], temperature)
    return torch.zeros(need.shape, dtype=values.dtype, device=values.device).masked_scatter(need, values)
