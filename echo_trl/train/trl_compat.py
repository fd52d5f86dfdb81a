"""Everything echo_trl takes from TRL's *private* ``GRPOTrainer`` internals, in one place.

Written against TRL 1.16 (``pyproject.toml`` pins ``trl>=1.16,<1.17``). No other module reads a
private attribute or calls a private method of TRL's trainer (``trainer.py`` only overrides hooks
and calls ``super()``); ``tests/train/test_trl_compat.py`` fails loudly when the installed TRL moved any
of what this module relies on. When TRL changes, this module (and the overridden hooks listed in
``echo_trl/trainer.py``) is what to re-check:

* ``_tokenizer``, ``_metrics``, ``_is_vlm`` and ``_signature_columns`` (:func:`tokenizer`,
  :func:`metrics`, :func:`is_vlm`, :func:`add_signature_columns`), and the class's ``_paper``
  (:func:`grpo_citation`); ``SFTTrainer`` has the same ``_tokenizer``, ``_metrics`` and ``_signature_columns``
  (TRL 1.16), which ``sft_trainer.py`` reads through the same functions;
* ``_generate``'s 8-tuple (:func:`generated_rollouts`);
* ``_get_per_token_logps_and_entropies``: the forward whose log-probs ECHO computes or reuses
  (:func:`run_loss_forward`, :func:`policy_logps`, :func:`no_grad_logps`; ``trainer.py`` overrides it to record
  the loss forward of ``_compute_loss``), and the result the shared-prefix forward stands in for
  (:func:`shared_forward`);
* ``_get_tool_suffix_ids``: how the tool loop renders the tokens after a tool call (a dummy
  user/assistant conversation, the tool messages, the next generation prompt; sliced after the
  assistant's end-of-turn token). :func:`render_tool_suffix` renders the same text.
* the old-log-prob and reference-model branches of ``_generate_and_score_completions``
  (:func:`add_sampling_logps`, :func:`needs_old_logps`, :func:`reference_logps`);
* ``environments`` and ``_sync_tool_dicts`` (the batch's environments and per-rollout sync tools, set by
  ``_generate`` before ``_tool_call_loop``), which :func:`concurrent_tool_calls` swaps inside a ``with`` block
  around ``_tool_call_loop``, and which :func:`verify_concurrently` scores before ``_calculate_rewards``;
* ``_step`` / ``_buffered_inputs``: the micro-step counter and the generation batch TRL reuses over
  ``steps_per_generation x num_iterations`` micro-steps (:func:`save_generation_buffer`);
* ``_prepare_inputs``' ``shuffle_sequence_dict`` of the generation batch before ``split_tensor_dict``
  (:func:`micro_batch_order`, the one module global of TRL's that echo_trl swaps, inside a ``with`` block at
  its call site in ``trainer.py``).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import trl.trainer.grpo_trainer as grpo
from trl import GRPOTrainer
from trl.trainer.utils import use_adapter

from ..prefix.attention import SharedLogps, shared_logps
from ..prefix.order import blocks_in_drawn_order
from .batch import GeneratedRollouts, forward_inputs
from .online.rollout_threads import RolloutThreads, ToolPrefetch, concurrent, verify_all

#: The TRL releases this module is written against (``pyproject.toml`` pins the same range).
TRL_VERSION_RANGE = ("1.16", "1.17")

#: Multimodal inputs TRL 1.16's ``_compute_loss`` forwards to ``_get_per_token_logps_and_entropies``.
FORWARD_KWARGS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


def render_tool_suffix(trainer, tool_messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The text whose tokens TRL 1.16's tool loop appends after a tool call (``_get_tool_suffix_ids``);
    ``add_generation_prompt=False`` leaves out the next turn's generation prompt TRL appends.

    It starts with the dummy conversation TRL renders (the caller aligns from the right, so only
    the part after the assistant's end-of-turn matters).
    """
    dummy = [
        {"role": "user", "content": "dummy"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": tool_messages[0].get("name", "tool"), "arguments": {}}}
            ],
        },
    ]
    return trainer.processing_class.apply_chat_template(
        dummy + tool_messages,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        chat_template=trainer.chat_template,
        **trainer.chat_template_kwargs,
    )


# --------------------------------------------------------------------------------------------
# Private attributes


def tokenizer(trainer):
    """The text tokenizer of ``processing_class`` (TRL unwraps a processor's)."""
    return trainer._tokenizer


def metrics(trainer, mode: str) -> dict[str, list[float]]:
    """TRL's per-mode metric lists (``"train"`` / ``"eval"``), averaged and cleared at each log."""
    return trainer._metrics[mode]


def is_vlm(trainer) -> bool:
    return trainer._is_vlm


def add_signature_columns(trainer, columns) -> None:
    """Keep ``columns`` in the dataloader's rows (transformers drops columns the model does not take)."""
    trainer._signature_columns = list(dict.fromkeys([*trainer._signature_columns, *columns]))


def grpo_citation() -> str | None:
    """GRPO's BibTeX entry as TRL keeps it for its model cards (``GRPOTrainer._paper``)."""
    return GRPOTrainer._paper.get("citation")


def generated_rollouts(result: tuple) -> GeneratedRollouts:
    """The parts of ``_generate``'s result the online masks need."""
    _, completion_ids, tool_mask, completions, _, extra_fields, _, _ = result
    return GeneratedRollouts(completion_ids, tool_mask, completions, extra_fields or {})


# --------------------------------------------------------------------------------------------
# Forwards


def policy_logps(trainer, model, input_ids, attention_mask, logits_to_keep, batch_size=None) -> torch.Tensor:
    """Per-token log-probs of ``model`` as TRL's forward computes them (at TRL's ``temperature``)."""
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
    )
    return logps


def no_grad_logps(trainer, batch: dict[str, Any], *, share: bool) -> torch.Tensor:
    """Per-token log-probs of ``trainer.model`` on a collated ``batch`` as TRL 1.16's loss forward computes them (its
    temperature, the accelerator's autocast; the shared-prefix forward when ``share``), without gradient and
    without logging metrics (TRL's own method, not the trainer's override): the starting-model log-probs of
    :mod:`echo_trl.train.offline.behavior`, at trainer init."""
    model, args = trainer.model, trainer.args
    input_ids, attention_mask, logits_to_keep = (
        t.to(trainer.accelerator.device) if torch.is_tensor(t) else t for t in forward_inputs(batch)
    )
    with torch.no_grad(), trainer.accelerator.autocast():
        if share:
            return shared_logps(
                model, input_ids, attention_mask, logits_to_keep, min_shared_tokens=args.prefix_sharing_min_tokens
            ).logps
        return GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, model, input_ids, attention_mask, logits_to_keep, batch_size=input_ids.size(0)
        )[0]


# --------------------------------------------------------------------------------------------
# Prefix sharing (offline): the shared-prefix forward, and a generation batch split in the sampler's order


def shared_forward(
    trainer,
    model,
    input_ids,
    attention_mask,
    logits_to_keep,
    batch_size=None,
    compute_entropy=False,
    compute_aux_loss=False,
    **multimodal,
) -> SharedLogps | None:
    """What TRL 1.16's ``_get_per_token_logps_and_entropies`` computes (``logps``, ``entropies``; no aux loss), from
    one shared-prefix forward of the whole micro-batch, scored through the fused LM head TRL's ``__init__`` installed
    (TRL's ``batch_size`` chunking is not needed: shared rows cost less), or ``None`` where it does not apply (MoE aux
    loss, multimodal inputs): TRL's forward then."""
    if compute_aux_loss or any(v is not None for v in multimodal.values()):
        return None
    with trainer.accelerator.autocast():
        return shared_logps(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            compute_entropy=compute_entropy,
            min_shared_tokens=trainer.args.prefix_sharing_min_tokens,
        )


@contextmanager
def micro_batch_order(*, offline: bool, share: bool):
    """Inside the block, how TRL 1.16's ``_prepare_inputs`` orders the generation batch before
    ``split_tensor_dict`` cuts it into micro-batches (its module global ``shuffle_sequence_dict``, which only
    decorrelates micro-batches):

    * offline: in the sampler's order (the epoch order is already random, and
      :func:`~echo_trl.prefix.order.prefix_grouped_order` put the groups together);
    * online with prefix sharing: whole groups shuffled (:func:`~echo_trl.prefix.order.blocks_in_drawn_order`, from
      TRL's own ``randperm`` draw), so a group's generations stay in one micro-batch;
    * online without: TRL's row shuffle.
    """
    if not offline and not share:
        yield
        return
    original = grpo.shuffle_sequence_dict
    grpo.shuffle_sequence_dict = (lambda batch: batch) if offline else _shuffle_groups
    try:
        yield
    finally:
        grpo.shuffle_sequence_dict = original


def _shuffle_groups(batch: dict[str, Any]) -> dict[str, Any]:
    """TRL's ``shuffle_sequence_dict`` moving whole groups (rows with the same prompt, next to each other)."""
    n = len(batch["prompt_ids"])
    rows = zip(batch["prompt_ids"], batch["prompt_mask"], strict=True)
    keys = [ids[mask.bool()].cpu().numpy().tobytes() for ids, mask in rows]
    order = torch.as_tensor(blocks_in_drawn_order(keys, torch.randperm(n).tolist()), dtype=torch.long)

    def permute(v):
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        return v[order] if isinstance(v, torch.Tensor) else [v[i] for i in order]

    return {key: permute(value) for key, value in batch.items()}


def run_loss_forward(trainer, model, inputs: dict[str, Any]) -> None:
    """The forward TRL's ``_compute_loss`` would run, without its loss (verifier-free ECHO: no policy term)."""
    trainer._get_per_token_logps_and_entropies(
        model, *forward_inputs(inputs), **{k: inputs.get(k) for k in FORWARD_KWARGS}
    )


def reference_logps(trainer, input_ids, attention_mask, logits_to_keep, batch_size):
    """Reference-model log-probs for the KL term, as TRL 1.16's ``_generate_and_score_completions`` gets them."""
    if trainer.ref_model is not None:
        return policy_logps(trainer, trainer.ref_model, input_ids, attention_mask, logits_to_keep, batch_size)
    model = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        return policy_logps(trainer, trainer.model, input_ids, attention_mask, logits_to_keep, batch_size)


def add_sampling_logps(trainer, batch: dict[str, Any], batch_size: int) -> None:
    """The log-probs TRL 1.16's ``_generate_and_score_completions`` adds to a generated batch, for a collated
    one: ``old_per_token_logps`` when generation and optimizer steps are misaligned (the policy at sampling
    time stands in for the behavior policy of rows that recorded none), and the reference model's for the
    KL term."""
    input_ids, attention_mask, logits_to_keep = forward_inputs(batch)
    with torch.no_grad():
        old = batch.get("old_per_token_logps")
        if needs_old_logps(trainer) and (old is None or torch.isnan(old).all(dim=1).any()):
            current = policy_logps(trainer, trainer.model, input_ids, attention_mask, logits_to_keep, batch_size)
            batch["old_per_token_logps"] = current if old is None else torch.where(torch.isnan(old), current, old)
        if trainer.beta != 0.0 and trainer.args.use_policy_loss:
            batch["ref_per_token_logps"] = reference_logps(
                trainer, input_ids, attention_mask, logits_to_keep, batch_size
            )


def needs_old_logps(trainer) -> bool:
    """Whether TRL 1.16 computes ``old_per_token_logps`` at generation time (generation and optimizer
    steps misaligned, or vLLM importance sampling)."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    return trainer.args.gradient_accumulation_steps % generate_every != 0 or (
        trainer.use_vllm and trainer.vllm_importance_sampling_correction
    )


# --------------------------------------------------------------------------------------------
# Environment work of a batch in flight together (environments that declare concurrent_rollouts)


@contextmanager
def concurrent_tool_calls(trainer, completions: list, threads: RolloutThreads):
    """Inside the block, TRL 1.16's ``_tool_call_loop`` reads per-rollout tools whose calls go out for every
    rollout at once (:class:`~echo_trl.train.online.rollout_threads.ToolPrefetch`), when the batch's environments
    allow it."""
    original = getattr(trainer, "_sync_tool_dicts", None)
    if original is None or not concurrent(trainer.environments):
        yield
        return
    trainer._sync_tool_dicts = ToolPrefetch(completions, original, threads.executor(len(original))).dicts
    try:
        yield
    finally:
        trainer._sync_tool_dicts = original


def verify_concurrently(trainer, threads: RolloutThreads) -> None:
    """The batch's environments' ``get_reward`` run in threads before TRL 1.16's ``_calculate_rewards`` calls them
    one by one (they return their first result again), when the environments allow it."""
    environments = trainer.environments
    if concurrent(environments):
        verify_all(environments, threads.executor(len(environments)))


# --------------------------------------------------------------------------------------------
# Exact resume: TRL's generation buffer in checkpoints
#
# TRL resumes with ``_step = 0`` and an empty buffer: a checkpoint inside a buffer (``steps_per_generation``
# > ``gradient_accumulation_steps``, or ``num_iterations`` > 1) would resume with a regenerated batch (other
# shuffle, other old log-probs) and shifted generation boundaries. With the buffer restored, resuming is
# bit-exact (tests/test_resume.py).


def _generation_buffer_file(trainer, checkpoint: str) -> Path:
    return Path(checkpoint) / f"echo_generation_buffer_{trainer.args.process_index}.pt"


def save_generation_buffer(trainer, output_dir: str) -> None:
    """Checkpoint TRL's position in its generation buffer (one file per process, next to ``rng_state*.pth``):
    the micro-step counter, and the buffered batch itself when the checkpoint falls inside a buffer (at a
    boundary TRL regenerates anyway)."""
    mid_buffer = trainer._step % (trainer.args.steps_per_generation * trainer.num_iterations) != 0
    torch.save(
        {
            "step": trainer._step,
            "buffered_inputs": trainer._buffered_inputs if mid_buffer else None,
            "num_processes": trainer.accelerator.num_processes,
        },
        _generation_buffer_file(trainer, output_dir),
    )


def load_generation_buffer(trainer, checkpoint: str | None) -> None:
    """Restore :func:`save_generation_buffer`'s state, if the checkpoint has one for this world size (another
    world size shards the data differently: every process keeps TRL's behaviour then)."""
    path = None if checkpoint is None else _generation_buffer_file(trainer, checkpoint)
    if path is None or not path.is_file():
        return
    saved = torch.load(path, map_location=trainer.accelerator.device, weights_only=True)
    if saved.get("num_processes") == trainer.accelerator.num_processes:
        trainer._step, trainer._buffered_inputs = saved["step"], saved["buffered_inputs"]


# --------------------------------------------------------------------------------------------
# SFTTrainer (TRL 1.16)


def sft_prepare_dataset(trainer):
    """TRL's own ``SFTTrainer._prepare_dataset`` of ``trainer`` (the subclass overrides it to add role weights):
    ``(dataset, processing_class, args, packing, formatting_func, dataset_name) -> dataset``."""
    from trl import SFTTrainer

    return SFTTrainer._prepare_dataset.__get__(trainer)


def log_sft_step_metrics(trainer, outputs, inputs: dict[str, Any], mode: str) -> None:
    """The metrics TRL 1.16's ``SFTTrainer.compute_loss`` logs after its loss, for a loss computed elsewhere:
    entropy and token accuracy over the scored tokens, ``num_tokens`` (the tokens seen in training) and the MoE
    ``aux_loss``; the same gathers and the same ``_total_train_tokens`` / ``_tp_size`` bookkeeping."""
    acc, m = trainer.accelerator, trainer._metrics[mode]
    num_valid = acc.gather_for_metrics(outputs.label_mask.sum()).sum()
    entropy_sum = acc.gather_for_metrics(outputs.entropy.detach().sum()).sum()
    num_correct = acc.gather_for_metrics(outputs.is_top1.sum()).sum()
    m["entropy"].append((entropy_sum / num_valid).item() if num_valid > 0 else 0.0)
    m["mean_token_accuracy"].append((num_correct / num_valid).item() if num_valid > 0 else 0.0)
    if mode == "train":
        if "attention_mask" in inputs:
            seen = acc.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
        else:  # padding-free: one flattened row
            local = torch.tensor(inputs["position_ids"].size(1), device=inputs["position_ids"].device)
            seen = acc.gather_for_metrics(local).sum().item()
        trainer._total_train_tokens += seen // trainer._tp_size
    m["num_tokens"] = [trainer._total_train_tokens]
    if trainer.aux_loss_enabled:
        m["aux_loss"].append(acc.gather_for_metrics(outputs.aux_loss).mean().item())
