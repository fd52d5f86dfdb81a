"""Forward a micro-batch's shared prefixes once: per-token log-probs identical to the unshared forward.

The rows of a micro-batch are folded into a prefix tree (:mod:`echo_trl.prefix.tree`) and forwarded as
**one packed sequence** of their unique tokens, in **one** model call:

* position ids are each token's position in its own row, so rotary embeddings see what they see unshared;
* attention is a registered ``transformers`` attention implementation (:data:`TREE_ATTENTION`): each
  segment's queries attend, through PyTorch's ``scaled_dot_product_attention`` (CPU flash kernel,
  CUDA flash / memory-efficient kernels), to the keys and values of its root-to-segment path only,
  causally. Called without a tree it *is* SDPA, so the model can keep it for generation and evaluation;
* the log-probs come from the model's own head: TRL's fused LM head (``add_fused_lm_head``, what
  ``GRPOTrainer`` installs) scores the packed positions through ``shift_labels``; or, for a plain
  model, ``log_softmax(logits / temperature)``.

Gradients are exact by construction: a shared key/value is gathered into every branch's attention,
so backward sums every branch's contribution into it, which is the unshared gradient summed over the
rows. Being one ordinary forward, it works under DDP, PEFT/LoRA and gradient checkpointing (the
recomputed layers get the same tree). Not supported: sliding-window layers, attention logit
soft-capping (raise), and position embeddings other than rotary ones give different numbers only as
far as the unshared padded forward itself shifts positions by its left padding.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .tree import PrefixTree, build_prefix_tree, gather_index, rows_from_padded

__all__ = ["enable_prefix_tree_attention", "shared_logps", "sharing_refusal"]

#: Name of the tree attention in ``transformers``' ``AttentionInterface`` / ``AttentionMaskInterface``.
TREE_ATTENTION = "echo_prefix_tree"

_PACKED = contextvars.ContextVar("echo_prefix_tree_packed", default=False)


#: Shortest common prefix worth sharing by default: below it the children's masked attention costs
#: more than the forward it saves.
MIN_SHARED_TOKENS = 64

#: Query block of a child segment: each block attends only up to its own last key, so the masked
#: attention skips the causal upper triangle block-wise (as ``is_causal`` does for a root) and its
#: masks hold about half the query-key pairs.
QUERY_BLOCK = 512


@dataclass(frozen=True)
class TreeAttentionPlan:
    """What every attention layer needs, built once per forward. Per segment: its query span in the
    packed sequence, the packed positions of its path's keys (``None`` for a root: its own span, plain
    causal), and its query blocks ``(start, end, keys, diagonal)`` relative to the segment: the block
    attends to the path's first ``keys`` keys, query ``i`` to key ``j`` iff ``j <= i + diagonal``."""

    segments: tuple[tuple[int, int, torch.Tensor | None, tuple[tuple[int, int, int, int], ...]], ...]
    masks: dict = field(default_factory=dict, compare=False)  # (dtype, device, block) -> additive mask

    @classmethod
    def from_tree(cls, tree: PrefixTree, device) -> TreeAttentionPlan:
        out = []
        for k, s in enumerate(tree.segments):
            if s.parent < 0:
                out.append((s.offset, s.offset + s.length, None, ()))
                continue
            index = tree.key_value_index(k)
            ancestors = len(index) - s.length  # the queries are the last `length` keys of the path
            blocks = tuple(
                (
                    start,
                    min(start + QUERY_BLOCK, s.length),
                    ancestors + min(start + QUERY_BLOCK, s.length),
                    ancestors + start,
                )
                for start in range(0, s.length, QUERY_BLOCK)
            )
            out.append((s.offset, s.offset + s.length, torch.as_tensor(index, device=device), blocks))
        return cls(tuple(out))

    def mask(self, block: tuple[int, int, int, int], dtype, device) -> torch.Tensor:
        """The block's additive mask (0 / -inf) in the attention's dtype, made once per forward and shared
        by every layer (and the recomputed ones). A boolean mask would be converted to such a tensor by
        SDPA in every layer, and each copy kept for backward."""
        key = (dtype, device, block)
        if key not in self.masks:
            start, end, keys, diagonal = block
            self.masks[key] = torch.full((end - start, keys), float("-inf"), dtype=dtype, device=device).triu(
                diagonal + 1
            )
        return self.masks[key]


def tree_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    prefix_tree: TreeAttentionPlan | None = None,
    **kwargs,
):
    """``transformers`` attention function: SDPA per tree segment over its path; plain SDPA without a tree."""
    if prefix_tree is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if kwargs.get("sliding_window") or kwargs.get("softcap"):
        raise NotImplementedError("prefix sharing supports full-attention layers without logit soft-capping")
    if query.shape[0] != 1:
        raise ValueError(f"prefix-tree attention takes one packed row, got a batch of {query.shape[0]}")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: one K/V head serves `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    outs = []
    for a, b, index, blocks in prefix_tree.segments:
        if index is None:
            outs.append(
                F.scaled_dot_product_attention(
                    query[:, :, a:b],
                    key[:, :, a:b],
                    value[:, :, a:b],
                    is_causal=True,
                    dropout_p=dropout,
                    scale=scaling,
                )
            )
            continue
        k, v = key.index_select(2, index), value.index_select(2, index)
        for block in blocks:
            start, end, keys, _ = block
            outs.append(
                F.scaled_dot_product_attention(
                    query[:, :, a + start : a + end],
                    k[:, :, :keys],
                    v[:, :, :keys],
                    attn_mask=prefix_tree.mask(block, query.dtype, query.device),
                    dropout_p=dropout,
                    scale=scaling,
                )
            )
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def _tree_mask(**kwargs):
    """No dense mask for a packed tree forward (each segment builds its own); SDPA's mask otherwise."""
    if _PACKED.get():
        return None
    return sdpa_mask(**kwargs)


def enable_prefix_tree_attention(model) -> None:
    """Switch ``model`` (a ``transformers`` model, or a PEFT model around one) to :data:`TREE_ATTENTION`.

    Idempotent. Calls without a tree run exactly SDPA, so generation and evaluation are unchanged.
    Kept for the model's lifetime rather than per call: gradient checkpointing recomputes the layers
    during backward, after the forward has returned.
    """
    AttentionInterface.register(TREE_ATTENTION, tree_attention)
    AttentionMaskInterface.register(TREE_ATTENTION, _tree_mask)
    base = _unwrap(model)
    if base.config._attn_implementation != TREE_ATTENTION:
        base.set_attn_implementation(TREE_ATTENTION)


def sharing_refusal(model, *, multimodal: bool = False) -> str | None:
    """Why the shared forward of ``model`` would not give the unshared numbers (one line), or ``None``.

    Refused: multimodal models (their position ids and inputs are not the packed text's), sliding-window layers
    and attention logit soft-capping (the tree attention has neither), and position embeddings that are not
    rotary (TRL's padded forward counts a row's positions from its first column, padding included; the packed
    forward from its first token, which only rotary attention cannot tell apart).
    """
    if multimodal:
        return "multimodal models are forwarded unshared"
    base = _unwrap(model)
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()) or getattr(
        config, "use_sliding_window", False
    ):
        return f"{config.model_type} has sliding-window attention layers"
    if getattr(config, "attn_logit_softcapping", None):
        return f"{config.model_type} soft-caps its attention logits"
    if not any(type(m).__name__.endswith("RotaryEmbedding") for m in base.modules()):
        return f"{config.model_type} has no rotary position embeddings"
    return None


def enable_sharing(models, *, multimodal: bool = False) -> str | None:
    """Prefix-tree attention on each of ``models`` (``None`` entries skipped; the first is the policy), or, where
    sharing could not be exact for the policy, the one-line reason (:func:`sharing_refusal`) and nothing changed."""
    refusal = sharing_refusal(models[0], multimodal=multimodal)
    if refusal is None:
        for model in models:
            if model is not None:
                enable_prefix_tree_attention(model)
    return refusal


def _unwrap(model):
    """The ``transformers`` model inside DDP (``.module``) and PEFT (``get_base_model``) wrappers."""
    model = getattr(model, "module", model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@dataclass
class SharedLogps:
    """Per-token log-probs of the completion tokens, in TRL's layout, and what sharing saved."""

    logps: torch.Tensor  # (rows, logits_to_keep); 0 where the column holds no completion token
    entropies: torch.Tensor | None  # same layout, when asked for
    forwarded_tokens: int  # unique tokens in the packed forward
    total_tokens: int  # tokens of the rows without padding (what an unshared padding-free forward processes)
    index: torch.Tensor  # (rows, logits_to_keep): packed position whose output scores each column (num_tokens: none)


def shared_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    *,
    compute_entropy: bool = False,
    fused_lm_head: bool = True,
    temperature: float = 1.0,
    min_shared_tokens: int = MIN_SHARED_TOKENS,
) -> SharedLogps:
    """Log-probs of the last ``logits_to_keep`` columns, as ``GRPOTrainer._get_per_token_logps_and_entropies``.

    Same inputs (``input_ids = cat(prompt_ids, completion_ids)``, its ``attention_mask``), same output
    layout (zeros where ``attention_mask`` is 0), same numbers up to float rounding, same gradients;
    every token shared by several rows forwarded once. ``fused_lm_head``: the model carries TRL's
    fused head (its temperature applies, as in ``GRPOTrainer``); else ``temperature`` divides the logits.
    ``min_shared_tokens``: shorter common prefixes are forwarded per row (see :data:`MIN_SHARED_TOKENS`).
    Call :func:`enable_prefix_tree_attention` on the model first. ``model`` may be wrapped (DDP, PEFT):
    it is called as given, once, so the wrapper's hooks run as for any forward.
    """
    if _unwrap(model).config._attn_implementation != TREE_ATTENTION:
        raise ValueError(
            "the model does not use prefix-tree attention: call enable_prefix_tree_attention(model) "
            "once before shared_logps"
        )
    ids, pos, scored = rows_from_padded(
        input_ids.detach().cpu().numpy(), attention_mask.detach().cpu().numpy(), logits_to_keep
    )
    tree = build_prefix_tree(ids, pos, min_shared_tokens=min_shared_tokens)
    packed_ids, packed_pos, next_ids = tree.packed()
    index, needed = gather_index(tree, scored, logits_to_keep)
    device = input_ids.device
    labels = torch.as_tensor(np.where(needed, next_ids, -100), device=device)[None]
    plan = TreeAttentionPlan.from_tree(tree, device)
    inputs = {
        "input_ids": torch.as_tensor(packed_ids, device=device)[None],
        "position_ids": torch.as_tensor(packed_pos, device=device)[None],
        "prefix_tree": plan,
    }
    with _packed():
        if fused_lm_head:
            out = model(**inputs, shift_labels=labels, fused_lm_head=True)
            per_pos, ent = out.log_probs[0], out.entropy[0] if compute_entropy and out.entropy is not None else None
            if compute_entropy and ent is None:
                raise ValueError("the fused LM head computes no entropy: add it with outputs=('log_probs', 'entropy')")
        else:
            logits = model(**inputs).logits[0].float() / temperature
            per_pos, ent = _selective_log_softmax(logits, labels[0], compute_entropy)
    rows_index = torch.as_tensor(index, device=device)
    pick = lambda x: torch.cat([x, x.new_zeros(1)])[rows_index]  # noqa: E731  (slot n: no scored token)
    return SharedLogps(
        pick(per_pos), pick(ent) if compute_entropy else None, tree.num_tokens, tree.total_tokens, rows_index
    )


@contextlib.contextmanager
def _packed():
    token = _PACKED.set(True)
    try:
        yield
    finally:
        _PACKED.reset(token)


def _selective_log_softmax(logits: torch.Tensor, labels: torch.Tensor, entropy: bool):
    """Log-prob of ``labels`` under ``logits`` (0 where the label is ignored), and optionally the entropy."""
    logp = torch.log_softmax(logits, dim=-1)
    keep = labels != -100
    picked = logp.gather(-1, labels.clamp(min=0)[:, None])[:, 0].masked_fill(~keep, 0.0)
    ent = (-(logp.exp() * logp).sum(-1)).masked_fill(~keep, 0.0) if entropy else None
    return picked, ent
