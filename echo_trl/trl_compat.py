"""Everything echo_trl takes from TRL's *private* ``GRPOTrainer`` internals, in one place.

Written against TRL 1.16 (``pyproject.toml`` pins ``trl>=1.16,<1.17``). When TRL changes, this
module (and the overridden hooks listed in ``echo_trl/trainer.py``) is what to re-check:

* ``GRPOTrainer._get_tool_suffix_ids``: how the tool loop renders the tokens after a tool call
  (a dummy user/assistant conversation, the tool messages, the next generation prompt; sliced
  after the assistant's end-of-turn token). :func:`render_tool_suffix` renders the same text.
* ``add_fused_lm_head``: TRL's forward returns temperature-scaled log-probs, computed from the
  backbone's ``last_hidden_state`` (``model.base_model``) projected by ``get_output_embeddings()``;
  :func:`capture_hidden_states` and :func:`logps_at_temperature` re-project those hidden states.
* the reference-model branch of ``_generate_and_score_completions`` (:func:`reference_logps`).
* ``_step`` / ``_buffered_inputs``: the micro-step counter and the generation batch TRL reuses over
  ``steps_per_generation x num_iterations`` micro-steps (:func:`generation_buffer_state`).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint

TRL_VERSION_TESTED = "1.16"

# Config attributes with which TRL's fused head rescales logits before the softmax; the second LM-head
# projection below does not reproduce them, so it refuses such models.
_LOGIT_RESCALING_ATTRS = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
                          "logits_scaling")


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


def render_tool_suffix(trainer, tool_messages: list[dict]) -> str:
    """The text whose tokens TRL 1.16's tool loop appends after a tool call (``_get_tool_suffix_ids``).

    It starts with the dummy conversation TRL renders (the caller aligns from the right, so only
    the part after the assistant's end-of-turn matters).
    """
    dummy = [
        {"role": "user", "content": "dummy"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": tool_messages[0].get("name", "tool"),
                                                          "arguments": {}}}]},
    ]
    return trainer.processing_class.apply_chat_template(
        dummy + tool_messages, add_generation_prompt=True, tokenize=False, chat_template=trainer.chat_template,
        **trainer.chat_template_kwargs)


def check_reprojection_supported(model) -> None:
    """Raise if the second LM-head projection cannot reproduce this model's logits."""
    config = causal_lm(model).config.get_text_config()
    found = [a for a in _LOGIT_RESCALING_ATTRS if getattr(config, a, None) not in (None, 1.0)]
    if found:
        from .errors import EchoTrlError

        raise EchoTrlError(
            f"world_loss_temperature differs from temperature, which re-projects hidden states through the LM head, "
            f"but this model rescales its logits ({', '.join(found)}); set world_loss_temperature equal to "
            "temperature (the world term then reuses TRL's log-probs)")


@contextmanager
def capture_hidden_states(model):
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


def logps_at_temperature(model, hidden: torch.Tensor, labels: torch.Tensor, temperature: float,
                         chunk_size: int = 1024) -> torch.Tensor:
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
        h, y = hidden[start:start + chunk_size], labels[start:start + chunk_size]
        out.append(checkpoint(score, h, y, use_reentrant=False) if torch.is_grad_enabled() else score(h, y))
    return torch.cat(out)


def reference_logps(trainer, input_ids, attention_mask, logits_to_keep, batch_size):
    """Reference-model log-probs for the KL term, as TRL 1.16's ``_generate_and_score_completions`` gets them."""
    from trl.trainer.utils import use_adapter

    if trainer.ref_model is not None:
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.ref_model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size)
        return logps
    model = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size)
    return logps


def needs_old_logps(trainer) -> bool:
    """Whether TRL 1.16 computes ``old_per_token_logps`` at generation time (generation and optimizer
    steps misaligned, or vLLM importance sampling)."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    return trainer.args.gradient_accumulation_steps % generate_every != 0 or (
        trainer.use_vllm and trainer.vllm_importance_sampling_correction)


def generation_buffer_state(trainer) -> dict:
    """TRL 1.16's position in its generation buffer, to checkpoint: the micro-step counter, and the buffered
    batch itself when the checkpoint falls inside a buffer (at a boundary TRL regenerates anyway)."""
    mid_buffer = trainer._step % (trainer.args.steps_per_generation * trainer.num_iterations) != 0
    return {"step": trainer._step, "buffered_inputs": trainer._buffered_inputs if mid_buffer else None}


def restore_generation_buffer(trainer, state: dict) -> None:
    """Put a :func:`generation_buffer_state` back (TRL itself resumes with ``_step = 0`` and no buffer)."""
    trainer._step, trainer._buffered_inputs = state["step"], state["buffered_inputs"]
