"""The trainer wired to issue #12's pieces: trajectories tokenized once at init (no chat template in a step),
and ``prefix_sharing`` giving the same losses, world metrics, gradients and weights as the unshared forward
(gradient accumulation, LoRA, truncation; two processes: ``test_trainer.py``'s DDP test)."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import batch, tiny_config, trajectory

from echo_trl.data.build import trajectories_to_dataset
from echo_trl.tokens import cache as token_cache
from echo_trl.tokens import tokenization
from echo_trl.tokens.cache import TOKEN_COLUMNS, has_tokens
from echo_trl.train import trl_compat
from echo_trl.train.offline import collator
from echo_trl.trainer import EchoGRPOTrainer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

ATOL = 1e-5


def grouped_dataset(n: int = 8):
    """Groups of 2 (rows next to each other), two groups per scenario (scenarios contiguous): the grouped epoch
    order of an unshuffled run is then the dataset order, so shared and unshared runs see the same batches."""
    rows = []
    for i in range(n):
        t = trajectory(i, [1.0, 0.0, 0.5, 0.1, 1.0, 0.3, 0.7, 0.2][i % 8], f"g{i // 2}")
        t.scenario = f"shop{i // 4}"
        rows.append(t)
    return trajectories_to_dataset(rows)


def make(tmp_path, share: bool, *, ds=None, model=None, peft_config=None, **kw) -> EchoGRPOTrainer:
    args = dict(
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=1e-2,
        world_model_coeff=0.5,
        shuffle_dataset=False,
        prefix_sharing=share,
        prefix_sharing_min_tokens=8,
        per_device_eval_batch_size=2,
        # SGD: weights move linearly in the gradient. Adam divides by sqrt(v), which turns float-rounding
        # differences of near-zero gradient entries into lr-sized steps (measured: up to 1e-4 after 2 steps).
        optim="sgd",
    )
    args.update(kw)
    return EchoGRPOTrainer(
        model or tiny_model(),
        args=tiny_config(tmp_path / f"share{int(share)}", **args),
        train_dataset=grouped_dataset() if ds is None else ds,
        processing_class=tiny_tokenizer("qwen3"),
        peft_config=peft_config,
    )


def _no_rendering(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a training step rendered / tokenized a trajectory")

    for module, name in [
        (collator, "tokenize_with_roles"),
        (tokenization, "tokenize_batch"),
        (tokenization, "tokenize_with_roles"),
        (tokenization, "layout"),
        (token_cache, "tokenize_rows"),
    ]:
        monkeypatch.setattr(module, name, boom)


def test_training_and_evaluation_steps_never_render_a_chat_template(tmp_path, monkeypatch):
    eval_trainer = EchoGRPOTrainer(
        tiny_model(),
        args=make(tmp_path, True).args,
        train_dataset=grouped_dataset(),
        eval_dataset=grouped_dataset(4),
        processing_class=tiny_tokenizer("qwen3"),
    )
    assert set(TOKEN_COLUMNS) <= set(eval_trainer.train_dataset.column_names)
    assert set(TOKEN_COLUMNS) <= set(eval_trainer.eval_dataset.column_names)
    _no_rendering(monkeypatch)
    seen = []
    original = collator.trajectory_features
    monkeypatch.setattr(
        "echo_trl.train.offline.recorded.trajectory_features",
        lambda tok, row, s: seen.append(has_tokens(row)) or original(tok, row, s),
    )
    eval_trainer.train()  # the dataloader keeps the cached columns (TRL's signature-column removal)
    metrics = eval_trainer.evaluate()
    assert seen and all(seen) and "eval_world/ce_env" in metrics
    with pytest.raises(AssertionError, match="rendered"):  # the patch is live: an uncached row would render
        original(
            tiny_tokenizer("qwen3"),
            dict(grouped_dataset(2)[0]),
            collator.CollatorSettings.from_args(eval_trainer.args),
        )


def _losses(trainer) -> list[dict]:
    keys = ("loss", "world/ce_env", "world/ce_warning", "world/loss_unscaled", "world/tokens_env", "entropy")
    return [{k: h[k] for k in keys if k in h} for h in trainer.state.log_history if "loss" in h]


def _assert_same_runs(a, b):
    la, lb = _losses(a), _losses(b)
    assert len(la) == len(lb) == a.args.max_steps and all(la)
    for x, y in zip(la, lb, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], abs=ATOL, rel=ATOL), k
    pa, pb = dict(a.model.named_parameters()), dict(b.model.named_parameters())
    moved = 0
    for name, p in pa.items():
        torch.testing.assert_close(pb[name], p, atol=ATOL, rtol=ATOL, msg=name)
        moved += p.requires_grad
    assert moved


@pytest.mark.parametrize("case", ["accumulation", "lora", "truncation"])
def test_shared_and_unshared_runs_are_the_same(tmp_path, case):
    kw, peft = {}, None
    if case == "accumulation":
        kw = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2)
    elif case == "lora":
        from peft import LoraConfig

        peft = LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM"
        )
        kw = dict(learning_rate=5e-2)
    else:
        kw = dict(max_completion_length=40)
    runs, orders = {}, {}
    for share in (False, True):
        trainer = make(tmp_path, share, peft_config=peft, **kw)
        orders[share] = list(trainer._get_train_sampler())
        trainer.train()
        runs[share] = trainer
    assert orders[True] == orders[False]  # the same batches in both modes (see grouped_dataset)
    packing = {s: [h["batch/packing_ratio"] for h in runs[s].state.log_history if "loss" in h] for s in runs}
    assert packing[True] and all(r > 1 for r in packing[True])  # really shared, and reported
    assert packing[False] and all(0 < r <= 1 for r in packing[False])  # TRL's padded rows: padding is run too
    if case == "truncation":
        assert any(h["world/truncated_tokens"] > 0 for h in runs[True].state.log_history if "loss" in h)
    _assert_same_runs(runs[False], runs[True])


def test_one_micro_batch_gives_the_same_loss_and_gradient(tmp_path, monkeypatch):
    """The shuffled grouped order differs from the unshared one: compare one identical micro-batch instead."""
    from transformers import AutoModelForCausalLM

    tiny_model().save_pretrained(tmp_path / "model")  # beta > 0: TRL loads the reference model from this path
    grads, losses, kl, calls = {}, {}, {}, []
    original = trl_compat.shared_logps
    monkeypatch.setattr(trl_compat, "shared_logps", lambda *a, **k: calls.append(1) or original(*a, **k))
    for share in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
        trainer = make(
            tmp_path, share, model=model, shuffle_dataset=True, max_completion_length=60, beta=0.04, num_iterations=2
        )  # the sampling-time old log-probs forward too
        calls.clear()  # (the starting-model log-probs at init)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
        inputs = batch(trainer, grouped_dataset(4))
        assert "ref_per_token_logps" in inputs and "old_per_token_logps" in inputs
        with torch.no_grad():  # a different policy than the reference (and the old policy): KL and ratios != 0
            for p in trainer.model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        losses[share], kl[share] = loss.item(), trl_compat.metrics(trainer, "train")["kl"][-1]
        # shared: the old, reference and loss forwards all went through shared_logps
        assert len(calls) == (3 if share else 0)
        grads[share] = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    assert losses[True] == pytest.approx(losses[False], abs=ATOL) and kl[True] == pytest.approx(kl[False], abs=ATOL)
    assert kl[True] > 0
    assert grads[True].keys() == grads[False].keys() and grads[True]
    for n in grads[True]:
        torch.testing.assert_close(grads[True][n], grads[False][n], atol=ATOL, rtol=1e-4, msg=n)


def test_shuffled_grouped_order_keeps_groups_in_one_micro_batch_and_is_resumable(tmp_path):
    trainer = make(
        tmp_path,
        True,
        shuffle_dataset=True,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        max_steps=-1,
    )
    groups = trainer.train_dataset["group_id"]
    sampler = trainer._get_train_sampler()
    streams = [list(sampler) for _ in range(2)]  # each generation batch of 4 twice (steps_per_generation)
    epochs = [list(dict.fromkeys(stream)) for stream in streams]
    assert epochs[0] != epochs[1] and sorted(epochs[0]) == list(range(8))  # each trajectory once per epoch
    for order in epochs:  # micro-batches of 2 consecutive rows hold one group
        assert all(groups[order[i]] == groups[order[i + 1]] for i in range(0, 8, 2))
    fresh = trainer._get_train_sampler()
    fresh.set_epoch(1)
    assert list(fresh) == streams[1]  # a pure function of (seed, epoch)
    # TRL's _prepare_inputs splits the generation batch in this order (no shuffle_sequence_dict)
    trainer.model.train()
    rows = [trainer.train_dataset[i] for i in epochs[0][:4]]
    first, alone = trainer._prepare_inputs(rows), batch(trainer, rows[:2])

    def completions(b):
        return [ids[mask.bool()].tolist() for ids, mask in zip(b["completion_ids"], b["completion_mask"], strict=True)]

    assert completions(first) == completions(alone)
