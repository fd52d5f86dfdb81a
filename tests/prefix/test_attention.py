"""The shared-prefix forward gives the unshared forward's log-probs, entropies, losses and gradients.

The reference is the unshared forward exactly as TRL 1.16's ``_get_per_token_logps_and_entropies``
runs it: ``cat(prompt, completion)`` padded (prompts left, completions right), labels masked outside
the completion, the model's fused LM head (``add_fused_lm_head``, what ``GRPOTrainer`` installs).
"""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import TEMPLATE_FAMILIES, tiny_tokenizer
from trl.trainer.utils import add_fused_lm_head

from echo_trl.demo.tiny import build_tiny_model
from echo_trl.prefix.attention import (
    MIN_SHARED_TOKENS,
    TREE_ATTENTION,
    enable_prefix_tree_attention,
    shared_logps,
    sharing_refusal,
)
from echo_trl.train.step.loss import world_loss

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

TEMPERATURE = 0.7


def _model(family="qwen3", seed=0):
    model = build_tiny_model(tiny_tokenizer(family), family, hidden_size=32, num_layers=2, num_heads=4, seed=seed)
    add_fused_lm_head(model, temperature=TEMPERATURE, outputs=("log_probs", "entropy"))
    return model


def _rand(g, n, vocab=500):  # the tiny tokenizers have about 535 tokens
    return torch.randint(5, vocab, (n,), generator=g).tolist()


def _batch(prompts, completions, pad=0, completion_masks=None):
    """TRL's layout: prompts left-padded, completions right-padded; input_ids, attention_mask, logits_to_keep."""
    P, C = max(map(len, prompts)), max(map(len, completions))
    pid = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])
    pm = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])
    cid = torch.tensor([c + [pad] * (C - len(c)) for c in completions])
    cm = torch.tensor([[1] * len(c) + [0] * (C - len(c)) for c in completions])
    if completion_masks is not None:
        cm = cm * torch.tensor(completion_masks)
    return torch.cat([pid, cid], 1), torch.cat([pm, cm], 1), C


def _shapes():
    """name -> (prompts, completions[, pad, completion_masks]) of several tree shapes."""
    g = torch.Generator().manual_seed(7)
    pre = _rand(g, 30)
    task = pre + _rand(g, 6)
    out = {}
    out["group"] = ([task] * 4, [_rand(g, n) for n in (9, 4, 13, 1)])
    tasks = [pre + _rand(g, n) for n in (5, 8)]
    out["groups_share_preamble"] = ([tasks[0]] * 2 + [tasks[1]] * 3, [_rand(g, n) for n in (6, 11, 3, 7, 7)])
    out["no_sharing"] = ([_rand(g, n) for n in (12, 20, 7)], [_rand(g, n) for n in (5, 9, 14)])
    common = _rand(g, 5)
    out["completions_share_a_start"] = ([task] * 3, [common + _rand(g, n) for n in (4, 8, 0)])
    out["batch_of_one"] = ([task], [_rand(g, 10)])
    dup = _rand(g, 8)
    out["identical_rows"] = ([task, task, pre + [7]], [dup, dup, _rand(g, 3)])
    comps = [_rand(g, n) for n in (8, 8, 5)]
    out["truncated_rows"] = ([task] * 3, comps, 0, [[1] * 8, [0] * 8, [1] * 5 + [0] * 3])  # row 1: masked completion
    return out


def _unshared(model, ids, mask, k):
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-k] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -k:], out.entropy[:, -k:]


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_equal(got, want):
    assert set(got) == set(want) and want
    for name, g in want.items():
        torch.testing.assert_close(
            got[name],
            g,
            rtol=1e-5,
            atol=1e-5 * float(g.abs().max().clamp(min=1e-12)),
            msg=lambda m, name=name: f"{name}: {m}",
        )


def _both(model, ids, mask, k, loss_fn, **kw):
    """(unshared, shared) -> (logps, entropies, loss, grads), each after its own backward."""
    results = []
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        if shared:
            r = shared_logps(model, ids, mask, k, compute_entropy=True, **{"min_shared_tokens": 1, **kw})
            lp, ent = r.logps, r.entropies
        else:
            lp, ent = _unshared(model, ids, mask, k)
        loss = loss_fn(lp)
        loss.backward()
        results.append((lp.detach(), ent.detach(), loss.detach(), _grads(model)))
    return results


def _weighted(k, seed=0):
    w = torch.randn(k, generator=torch.Generator().manual_seed(seed))
    return lambda lp: (lp * w).sum()


@pytest.mark.parametrize("family", TEMPLATE_FAMILIES)
@pytest.mark.parametrize("shape", list(_shapes()))
def test_logps_entropies_and_gradients_match_unshared(family, shape):
    model = _model(family)
    enable_prefix_tree_attention(model)
    ids, mask, k = _batch(*_shapes()[shape])
    (lp0, ent0, loss0, g0), (lp1, ent1, loss1, g1) = _both(model, ids, mask, k, _weighted(k))
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-5)
    assert (lp1[mask[:, -k:] == 0] == 0).all()  # TRL's layout: zeros off the completion tokens
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-5)
    _assert_grads_equal(g1, g0)


def test_sharing_forwards_each_shared_token_once():
    """A group of 4 sharing a 36-token prompt: the prompt once (minus the token each branch re-opens with)."""
    prompts, completions = _shapes()["group"]
    model = _model()
    enable_prefix_tree_attention(model)
    ids, mask, k = _batch(prompts, completions)
    r = shared_logps(model, ids, mask, k, min_shared_tokens=1)
    total = sum(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    assert r.total_tokens == total
    assert r.forwarded_tokens == total - 3 * (len(prompts[0]) - 1)
    assert (r.index[mask[:, -k:] == 0] == r.forwarded_tokens).all()  # padding reads the zero slot
    assert (r.index[mask[:, -k:] == 1] < r.forwarded_tokens).all()


def test_default_leaves_short_common_prefixes_unshared():
    """By default a prompt shorter than MIN_SHARED_TOKENS is forwarded per row: padding-free packing, same numbers."""
    prompts, completions = _shapes()["groups_share_preamble"]
    assert max(map(len, prompts)) < MIN_SHARED_TOKENS
    model = _model()
    enable_prefix_tree_attention(model)
    ids, mask, k = _batch(prompts, completions)
    r = shared_logps(model, ids, mask, k)
    assert r.forwarded_tokens == r.total_tokens == int(mask.sum())
    with torch.no_grad():
        torch.testing.assert_close(r.logps.detach(), _unshared(model, ids, mask, k)[0], rtol=0, atol=1e-5)


def test_ddp_wrapped_model_gives_the_same_gradients(tmp_path):
    """One process of DDP (gloo): the wrapper is called once, as for any forward, and its gradients are exact."""
    import torch.distributed as dist

    model = _model("qwen2_5")
    enable_prefix_tree_attention(model)
    ids, mask, k = _batch(*_shapes()["groups_share_preamble"])
    (_, _, _, g0), _ = _both(model, ids, mask, k, _weighted(k, 4))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        enable_prefix_tree_attention(ddp)  # unwraps; already on
        ddp.zero_grad(set_to_none=True)
        _weighted(k, 4)(shared_logps(ddp, ids, mask, k, min_shared_tokens=1).logps).backward()
        _assert_grads_equal(
            {n.removeprefix("module."): p.grad for n, p in ddp.named_parameters() if p.grad is not None}, g0
        )
    finally:
        dist.destroy_process_group()


def test_world_loss_and_grpo_loss_from_shared_logps_match():
    """ECHO's world term (echo_trl.train.step.loss.world_loss over env tokens) and a GRPO-style clipped-ratio term."""
    prompts, completions = _shapes()["groups_share_preamble"]
    ids, mask, k = _batch(prompts, completions)
    g = torch.Generator().manual_seed(3)
    completion_mask = mask[:, -k:]
    env = (torch.rand(completion_mask.shape, generator=g) < 0.5) & completion_mask.bool()
    action = ~env & completion_mask.bool()
    adv = torch.randn(len(prompts), generator=g)
    old = torch.randn(completion_mask.shape, generator=g) * 0.05

    def grpo(lp):
        ratio = torch.exp(lp - (lp.detach() + old))
        per_token = -torch.min(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
        return ((per_token * action).sum(-1) / action.sum(-1).clamp(min=1)).mean()

    model = _model("llama3_1")
    enable_prefix_tree_attention(model)
    for loss_fn in (
        lambda lp: world_loss(lp, env, normalization="token").loss,
        lambda lp: world_loss(lp, env, normalization="sequence", divisor=3.0).loss,
        grpo,
        lambda lp: grpo(lp) + 0.1 * world_loss(lp, env).loss,
    ):
        (_, _, loss0, g0), (_, _, loss1, g1) = _both(model, ids, mask, k, loss_fn)
        torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
        _assert_grads_equal(g1, g0)


def test_plain_model_without_fused_head_uses_log_softmax_at_temperature():
    model = build_tiny_model(tiny_tokenizer("qwen2_5"), "qwen2_5", hidden_size=32, num_layers=2, seed=1)
    ids, mask, k = _batch(*_shapes()["groups_share_preamble"])
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -k - 1 : -1].float() / TEMPERATURE
    want = torch.log_softmax(logits, -1).gather(-1, ids[:, -k:, None])[..., 0] * mask[:, -k:]
    enable_prefix_tree_attention(model)
    got = shared_logps(model, ids, mask, k, fused_lm_head=False, temperature=TEMPERATURE, min_shared_tokens=1)
    torch.testing.assert_close(got.logps, want, rtol=0, atol=1e-5)


def test_lora_adapter_gradients_match():
    peft = pytest.importorskip("peft")
    model = _model("qwen3")
    model = peft.get_peft_model(
        model,
        peft.LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False
        ),
    )
    enable_prefix_tree_attention(model)
    ids, mask, k = _batch(*_shapes()["groups_share_preamble"])
    (lp0, _, _, g0), (lp1, _, _, g1) = _both(model, ids, mask, k, _weighted(k, 1))
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    assert all("lora_" in n for n in g0)
    _assert_grads_equal(g1, g0)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(reentrant):
    model = _model("qwen3")
    enable_prefix_tree_attention(model)
    ids, mask, k = _batch(*_shapes()["group"])
    (_, _, _, g0), _ = _both(model, ids, mask, k, _weighted(k, 2))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    _, (_, _, _, g1) = _both(model, ids, mask, k, _weighted(k, 2))
    _assert_grads_equal(g1, g0)


def test_tree_attention_without_a_tree_is_sdpa():
    """The implementation the model keeps: plain calls (generation, evaluation) are unchanged."""
    model = _model("qwen3")
    ids, mask, _ = _batch(*_shapes()["no_sharing"])
    before = model(input_ids=ids, attention_mask=mask).logits
    enable_prefix_tree_attention(model)
    enable_prefix_tree_attention(model)  # idempotent
    assert model.config._attn_implementation == TREE_ATTENTION
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask).logits, before, rtol=0, atol=0)


def test_model_without_tree_attention_is_refused():
    model = _model("qwen3")
    ids, mask, k = _batch(*_shapes()["batch_of_one"])
    with pytest.raises(ValueError, match="enable_prefix_tree_attention"):
        shared_logps(model, ids, mask, k)


def test_no_grad_reference_logps():
    """Old-policy / reference log-probs are computed under no_grad: same numbers, no graph."""
    model = _model("qwen3")
    enable_prefix_tree_attention(model)
    ids, mask, k = _batch(*_shapes()["groups_share_preamble"])
    with torch.no_grad():
        want, _ = _unshared(model, ids, mask, k)
        got = shared_logps(model, ids, mask, k, min_shared_tokens=1)
    assert not got.logps.requires_grad
    torch.testing.assert_close(got.logps, want, rtol=0, atol=1e-5)


def test_children_split_into_query_blocks(monkeypatch):
    """Long children attend block by block (each block up to its own last key); tiny blocks force many."""
    import echo_trl.prefix.attention as ps

    monkeypatch.setattr(ps, "QUERY_BLOCK", 4)
    model = _model("llama3_1")
    enable_prefix_tree_attention(model)
    ids, mask, k = _batch(*_shapes()["completions_share_a_start"])
    (lp0, _, _, g0), (lp1, _, _, g1) = _both(model, ids, mask, k, _weighted(k, 5))
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=1e-5)
    _assert_grads_equal(g1, g0)


def test_models_sharing_cannot_reproduce_are_refused_in_one_line():
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = tiny_tokenizer("qwen3")
    assert sharing_refusal(build_tiny_model(tok, "qwen3", hidden_size=32)) is None
    small = dict(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    cases = {
        "sliding-window attention layers": AutoConfig.for_model(
            "qwen2", **small, use_sliding_window=True, sliding_window=8, max_window_layers=0
        ),
        "soft-caps its attention logits": AutoConfig.for_model(
            "gemma2", **small, head_dim=8, layer_types=["full_attention"] * 2
        ),
        "no rotary position embeddings": AutoConfig.for_model("gpt2", vocab_size=64, n_embd=16, n_layer=1, n_head=2),
    }
    for reason, config in cases.items():
        refusal = sharing_refusal(AutoModelForCausalLM.from_config(config))
        assert refusal is not None and reason in refusal and "\n" not in refusal, (reason, refusal)
    assert "multimodal" in sharing_refusal(build_tiny_model(tok, "qwen3", hidden_size=32), multimodal=True)
