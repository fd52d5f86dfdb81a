"""No non-finite update is applied, and no non-finite weights are ever saved.

One non-finite number anywhere in a step (a corrupt behaviour log-prob whose importance ratio overflows ``exp``,
an fp16 logit overflow, a NaN reward that slipped past a custom dataset) makes every weight NaN in one optimizer
step while the Trainer logs the loss as 0, and the next checkpoint saves them. :class:`FiniteGuard`, a
``transformers`` ``TrainerCallback``, checks at three points and **stops** the run with one line
(:class:`EchoTrlError`, exit 2 from the commands) naming the optimizer step, the batch's rows and the field:

1. each training micro-batch's loss terms (``EchoGRPOTrainer._compute_loss`` calls :meth:`FiniteGuard.check_loss`
   before ``backward``): the GRPO term and the world term, each by name;
2. the accumulated gradients of the whole loss (both terms), in ``on_pre_optimizer_step``: before
   ``optimizer.step()``;
3. the trainable weights after each update, in ``on_step_end``: before the Trainer's checkpoint save of that step.

Stopping, not skipping: a non-finite step means an input the checks at the door let through or a forward that
overflowed; skipping it would hide a cause that usually recurs (a run that skips every step reports success),
and a skip needs the Trainer's private step state (optimizer, scheduler, gradient scaler) kept consistent on every
process. Each decision is all-reduced, so every process stops at the same point (none waits in a collective).
Under DeepSpeed the gradients live in the engine (``param.grad`` is None): there point 2 sees nothing and point 3
stops the run after the update, still before any checkpoint of those weights.

:func:`require_finite_weights` is the last line at every save (``save_model``, which checkpoints also go through):
it refuses to write non-finite weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from transformers import TrainerCallback

from ...data.readers.fields import BEHAVIOR_LOGPROB_FLOOR, BEHAVIOR_LOGPROB_TOLERANCE
from ...errors import EchoTrlError
from ..offline.collator import TRAIN_INDEX

__all__ = ["FiniteGuard", "require_finite_weights"]

#: ``exp`` overflows float32 above this: an importance log-ratio beyond it is an infinite ratio.
FLOAT32_EXP_LIMIT = math.log(torch.finfo(torch.float32).max)

FP16_ADVICE = (
    "This is usually an fp16 overflow: train in bf16 (bf16=True, or load the model with dtype=torch.bfloat16) or "
    "float32."
)


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    """This process's values of a parameter or gradient: an FSDP ``DTensor``'s local shard, a ZeRO-3 partition."""
    if t is None:
        return None
    if hasattr(t, "to_local"):
        t = t.to_local()
    if t.numel() == 0 and getattr(t, "ds_tensor", None) is not None:
        t = t.ds_tensor
    return t


def non_finite(named: Iterable[tuple[str, torch.Tensor | None]]) -> list[str]:
    """The names of the tensors that hold a NaN or an infinity (one host sync for all of them)."""
    items = [(n, t) for n, t in ((n, _local(t)) for n, t in named) if t is not None and t.numel()]
    if not items:
        return []
    device = items[0][1].device
    ok = torch.stack([torch.isfinite(t).all().to(device) for _, t in items])
    if bool(ok.all()):
        return []
    return [items[i][0] for i in (~ok).nonzero().flatten().tolist()]


def require_finite_weights(model, where: str) -> None:
    """Refuse to save non-finite weights (this process's parameters; local, no collective: a save may run on one
    process only, and :class:`FiniteGuard` already stopped every process at the update that made them)."""
    bad = non_finite(model.named_parameters())
    if bad:
        raise EchoTrlError(
            f"refusing to save {where}: {len(bad)} weight tensor(s) hold NaN or infinity (first: {bad[0]}); nothing "
            "was written"
        )


def _rows(rows: list[int]) -> str:
    return f"rows {', '.join(map(str, sorted(set(rows))))} of train_dataset" if rows else "rows unknown"


def loss_suspect(inputs: dict[str, Any], logps: torch.Tensor | None) -> str:
    """Which input of a micro-batch explains a non-finite GRPO loss (the first that is out of range), or ''."""
    completion = inputs["completion_mask"].bool()
    action = completion & inputs["tool_mask"].bool() if "tool_mask" in inputs else completion
    advantages = inputs.get("advantages")
    if advantages is not None and not torch.isfinite(advantages).all():
        return "field advantages (from the rows' reward): non-finite"
    old = inputs.get("old_per_token_logps")
    if old is not None and action.any():
        values = old[action]
        bad = ~torch.isfinite(values) | (values < BEHAVIOR_LOGPROB_FLOOR) | (values > BEHAVIOR_LOGPROB_TOLERANCE)
        if bad.any():
            return (
                f"field old_per_token_logps (the rows' behavior_logprobs, or the starting model's): "
                f"{values[bad][0].item():g} at an action token"
            )
    if logps is not None and not torch.isfinite(logps.detach()[completion]).all():
        return f"the forward's per-token log-probs are non-finite. {FP16_ADVICE}"
    ref = inputs.get("ref_per_token_logps")
    if ref is not None and not torch.isfinite(ref[action]).all():
        return "field ref_per_token_logps (the reference model's log-probs): non-finite"
    return ""


class FiniteGuard(TrainerCallback):
    """Stops training before a non-finite loss, gradient or weight is applied or saved (see the module docstring).

    ``trainer``: the Trainer it is added to (its accelerator all-reduces the decisions). The GRPO trainer tells it
    each training micro-batch's rows through :meth:`check_loss`; other trainers name no rows.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.rows: list[int] = []  # the rows of the optimizer step being accumulated
        self.log_ratio_max: list[torch.Tensor] = []  # per micro-batch, the largest importance log-ratio (no sync)

    @classmethod
    def added_to(cls, trainer) -> FiniteGuard:
        """A guard for ``trainer``, added to its callbacks (``Trainer.add_callback``)."""
        guard = cls(trainer)
        trainer.add_callback(guard)
        return guard

    def _anywhere(self, bad: bool) -> bool:
        """``bad`` on any process (every process must call it at the same point)."""
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:
            return bad
        flag = torch.tensor([float(bad)], device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="sum").item() > 0)

    # ------------------------------------------------------------------------------------------
    # 1. The loss terms of each micro-batch, before backward

    def check_loss(
        self,
        inputs: dict[str, Any],
        *,
        policy: torch.Tensor | None,
        world: torch.Tensor | None,
        logps: torch.Tensor | None,
    ) -> None:
        """Raise when the GRPO term (``policy``) or the world term (``world``, ``None`` when it is not added) of a
        training micro-batch is non-finite on any process; otherwise remember its rows for the gradient check."""
        step = self.trainer.state.global_step + 1  # the optimizer step this micro-batch accumulates into
        index = inputs.get(TRAIN_INDEX)
        rows = [] if index is None else index.tolist()
        bad_policy = policy is not None and not bool(torch.isfinite(policy.detach()).all())
        bad_world = world is not None and not bool(torch.isfinite(world.detach()).all())
        if not self._anywhere(bad_policy or bad_world):
            self.rows += rows
            old = inputs.get("old_per_token_logps")
            if old is not None and logps is not None:
                mask = inputs["completion_mask"].bool() & inputs.get("tool_mask", inputs["completion_mask"]).bool()
                ratio = (logps.detach().float() - old.float()).masked_fill(~mask, -math.inf)
                self.log_ratio_max.append(torch.cat([ratio.flatten(), ratio.new_full((1,), -math.inf)]).max())
            return
        where = _rows(rows) if bad_policy or bad_world else "on another process"
        if bad_world:
            policy_note = (
                "" if policy is None else f"; the GRPO term is {'non-finite too' if bad_policy else 'finite'}"
            )
            raise EchoTrlError(
                f"optimizer step {step}: the world-model cross-entropy on environment-output tokens is "
                f"{world.item()} (non-finite per-token log-probs from the forward){policy_note}. Stopped before the "
                f"update would make the weights NaN ({where}). {FP16_ADVICE}"
            )
        if bad_policy:
            suspect = loss_suspect(inputs, logps) or "no input out of range"
            raise EchoTrlError(
                f"optimizer step {step}: the GRPO loss is {policy.item()} ({where}; {suspect}). Stopped before the "
                "update: no weights changed, nothing saved"
            )
        raise EchoTrlError(
            f"optimizer step {step}: a loss term is non-finite on another process: stopped before the update"
        )

    # ------------------------------------------------------------------------------------------
    # 2. The gradients, before optimizer.step(); 3. the weights, before the step's checkpoint

    def on_train_begin(self, args, state, control, **kwargs):
        self.rows, self.log_ratio_max = [], []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        model = self.trainer.model
        bad = non_finite((n, p.grad) for n, p in model.named_parameters() if p.requires_grad)
        if not self._anywhere(bool(bad)):
            return
        step = state.global_step + 1
        total = sum(1 for p in model.parameters() if p.requires_grad)
        which = (
            f"{len(bad)} of {total} parameter tensors (first: {bad[0]}"
            + (", after gradient clipping spread the NaN norm" if args.max_grad_norm and len(bad) > 1 else "")
            + ")"
            if bad
            else "on another process"
        )
        ratio = max((r.item() for r in self.log_ratio_max), default=-math.inf)
        cause = (
            f"; the largest importance log-ratio is {ratio:g}, beyond float32's exp ({FLOAT32_EXP_LIMIT:.1f}): field "
            "old_per_token_logps (the rows' behavior_logprobs, or the starting model's log-probs)"
            if ratio > FLOAT32_EXP_LIMIT
            else ""
        )
        raise EchoTrlError(
            f"optimizer step {step}: non-finite gradient of the loss (GRPO + world term) in {which}, from "
            f"{_rows(self.rows)}; every loss term was finite{cause}. Stopped before the update: no weights changed, "
            "nothing saved"
        )

    def on_step_end(self, args, state, control, **kwargs):
        rows, self.rows, self.log_ratio_max = self.rows, [], []
        model = self.trainer.model
        bad = non_finite((n, p) for n, p in model.named_parameters() if p.requires_grad)
        if self._anywhere(bool(bad)):
            first = f" (first: {bad[0]})" if bad else " on another process"
            raise EchoTrlError(
                f"optimizer step {state.global_step}: the update made {len(bad) or 'some'} weight tensor(s) "
                f"non-finite{first}, from {_rows(rows)}, with finite gradients (learning rate too high?). Stopped "
                "before any checkpoint of these weights was written"
            )
