"""Half-precision guards of the world term: why fp16 is risky for ECHO, and the error when it overflowed.

fp16 tops out at 65504 and TRL's fused LM head computes the logits in the weight / autocast dtype,
so large logits or activations become inf and the log-probs NaN. bf16 has float32's range at the
same memory.
"""

from __future__ import annotations

import math

import torch

from ..errors import EchoTrlError

FP16_WARNING = (
    "fp16 weights or autocast: fp16 overflows above 65504, so large logits or activations turn the per-token "
    "log-probs (GRPO's and the world CE's) into inf/NaN, and ECHO stops with an error when the world term does. "
    "Prefer bf16 where the hardware has it (bf16=True, or load the model with dtype=torch.bfloat16): the same "
    "memory as fp16 with float32's range. Keeping fp16, cast_lm_head_to_fp32=True at least computes the logits "
    "in float32."
)


def uses_fp16(model, accelerator) -> bool:
    """fp16 weights, or a forward autocast to fp16 (accelerate's ``fp16=True``, a caller's autocast).

    The autocast is probed inside ``accelerator.autocast()``, where TRL runs the forward (on CPU
    accelerate runs ``fp16=True`` in fp32).
    """
    device = accelerator.device.type
    weights = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    with accelerator.autocast():
        autocast = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16
    return weights == torch.float16 or autocast


def check_world_finite(value: float, step: int, policy_loss: torch.Tensor | None) -> None:
    """Stop before a non-finite world term reaches ``backward``.

    Raising, not skipping the term: the world CE reuses GRPO's own log-probs, so a non-finite one means
    the forward overflowed (typically fp16). TRL's policy loss is then non-finite too (its masks multiply,
    NaN x 0 is NaN) and an overflowed head backpropagates NaN: one step makes every weight NaN while the
    Trainer logs the loss as 0. Dropping only the world term would not prevent that. ``value`` is the
    all-reduced ``world/loss_unscaled``, so every process raises at the same micro-batch (none is left
    waiting in the gradient all-reduce).
    """
    if math.isfinite(value):
        return
    policy = (
        ""
        if policy_loss is None
        else "; the GRPO term is " + ("finite" if torch.isfinite(policy_loss).item() else "non-finite too")
    )
    raise EchoTrlError(
        f"optimizer step {step}: the world-model cross-entropy on environment-output tokens is {value} "
        f"(non-finite per-token log-probs from the forward){policy}. Stopped before the update would make the "
        "weights NaN. This is usually an fp16 overflow: train in bf16 (bf16=True, or load the model with "
        "dtype=torch.bfloat16) or float32."
    )
