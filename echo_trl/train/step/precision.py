"""Half precision: why fp16 is risky for ECHO (the stop when it overflowed is :mod:`echo_trl.train.step.finite`'s).

fp16 tops out at 65504 and TRL's fused LM head computes the logits in the weight / autocast dtype,
so large logits or activations become inf and the log-probs NaN. bf16 has float32's range at the
same memory.
"""

from __future__ import annotations

import torch

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
