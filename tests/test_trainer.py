"""EchoGRPOTrainer with tiny local models: one forward, lambda=0 == GRPO, gradients vs a reference,
exact accumulation, offline advantages, importance ratios, held-out CE, online env masks."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers.processes import free_port
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import (
    assert_same_gradient,
    batch,
    count_forwards,
    dataset,
    fixed_rollout,
    make_trainer,
    prompt_dataset,
    reference_logps,
    tiny_config,
    trajectory,
)

from echo_trl.data.build import trajectories_to_dataset
from echo_trl.errors import EchoTrlError
from echo_trl.train import trl_compat
from echo_trl.train.offline.advantages import ADVANTAGE_COLUMN
from echo_trl.trainer import EchoGRPOTrainer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def reference_world_loss(model, inputs, normalization: str, temperature: float = 1.0):
    logp = reference_logps(model, inputs, temperature)
    mask = inputs["env_output_mask"].bool() & inputs["completion_mask"].bool()
    nll = torch.where(mask, -logp, torch.zeros_like(logp))
    if normalization == "token":
        return nll.sum() / mask.sum()
    per_seq = mask.sum(-1)
    keep = per_seq > 0
    return (nll.sum(-1)[keep] / per_seq[keep]).mean()


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("coeff, temperature", [(0.0, 1.0), (0.05, 1.0), (0.05, 0.7)])
def test_one_grad_forward_per_micro_batch(tmp_path, coeff, temperature):
    """As many forwards as plain GRPO: one grad-enabled per micro-batch, none without grad (on-policy data),
    also when the world CE runs at another temperature than TRL's log-probs."""
    trainer = make_trainer(
        tmp_path,
        dataset(8),
        world_model_coeff=coeff,
        temperature=temperature,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=2,
    )
    calls, handle = count_forwards(trainer.model)
    trainer.train()
    handle.remove()
    assert calls == [True] * 4  # 2 optimizer steps x 2 micro-batches
    logs = [h for h in trainer.state.log_history if "world/ce_env" in h]
    assert len(logs) == 2 and all(math.isfinite(h["world/ce_env"]) for h in logs)


def test_misaligned_generation_gets_old_logps_from_one_no_grad_forward_like_trl(tmp_path):
    """num_iterations=2 reuses each batch: like TRL, one no-grad forward per generation batch records the
    sampling-time log-probs (behavior_policy="current"), then one grad forward per micro-batch. With "initial"
    the starting model's, computed once at init, stand in: no forward per generation batch."""
    for policy, expected in (("current", [False, True, True]), ("initial", [True, True])):
        trainer = make_trainer(tmp_path / policy, num_iterations=2, max_steps=2, behavior_policy=policy)
        calls, handle = count_forwards(trainer.model)
        trainer.train()
        handle.remove()
        assert calls == expected
        ratios = [h["clip_ratio/region_mean"] for h in trainer.state.log_history if "clip_ratio/region_mean" in h]
        assert len(ratios) == 2


def test_kl_term_with_reference_model(tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_model().save_pretrained(tmp_path / "model")  # TRL loads the reference model from the policy's path
    trainer = make_trainer(tmp_path, model=AutoModelForCausalLM.from_pretrained(tmp_path / "model"), beta=0.04)
    inputs = batch(trainer)
    assert "ref_per_token_logps" in inputs
    loss = trainer._compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss) and trl_compat.metrics(trainer, "train")["kl"] == [pytest.approx(0.0, abs=1e-6)]


def test_lambda_zero_reproduces_grpo_loss_exactly(tmp_path):
    from trl import GRPOTrainer

    trainer = make_trainer(tmp_path, world_model_coeff=0.0, behavior_policy="current")  # TRL's on-policy batch
    inputs = batch(trainer)
    model = trainer.model
    echo = trainer._compute_loss(model, inputs)
    (g_echo,) = torch.autograd.grad(echo, [model.model.embed_tokens.weight])
    grpo = GRPOTrainer._compute_loss(trainer, model, inputs)
    (g_grpo,) = torch.autograd.grad(grpo, [model.model.embed_tokens.weight])
    assert torch.equal(echo, grpo) and torch.equal(g_echo, g_grpo)
    assert echo.item() != 0.0  # a real policy loss (advantages are non-zero)

    # and lambda > 0 adds exactly lambda x (independent full-logits CE) to that same GRPO loss
    trainer.args.world_model_coeff = 0.05
    with_world = trainer._compute_loss(model, inputs)
    ref = reference_world_loss(model, inputs, "sequence")
    assert with_world.item() == pytest.approx(grpo.item() + 0.05 * ref.item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("normalization", ["token", "sequence"])
def test_world_gradient_matches_full_logits_reference(tmp_path, normalization):
    trainer = make_trainer(
        tmp_path, world_model_coeff=1.0, use_policy_loss=False, world_loss_normalization=normalization
    )
    inputs = batch(trainer)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    loss = trainer._compute_loss(trainer.model, inputs)
    grads = torch.autograd.grad(loss, params)
    ref = reference_world_loss(trainer.model, inputs, normalization)
    ref_grads = torch.autograd.grad(ref, params)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_world_temperature_one_is_true_ce_even_when_trl_samples_at_0_7(tmp_path):
    trainer = make_trainer(
        tmp_path,
        world_model_coeff=1.0,
        use_policy_loss=False,
        temperature=0.7,
        world_loss_temperature=1.0,
        world_loss_normalization="token",
    )
    inputs = batch(trainer)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    calls, handle = count_forwards(trainer.model)
    loss = trainer._compute_loss(trainer.model, inputs)
    handle.remove()
    assert calls == [True]
    grads = torch.autograd.grad(loss, params)
    ref = reference_world_loss(trainer.model, inputs, "token", temperature=1.0)
    ref_grads = torch.autograd.grad(ref, params)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert abs(ref.item() - reference_world_loss(trainer.model, inputs, "token", 0.7).item()) > 1e-3
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)


def test_batch_without_env_tokens_trains_policy_and_gives_zero_world_loss(tmp_path):
    ds = dataset(4, empty_outputs=True)
    trainer = make_trainer(tmp_path, ds, world_model_coeff=0.05)
    inputs = batch(trainer)
    assert inputs["env_output_mask"].sum() == 0
    loss = trainer._compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in trainer.model.parameters() if p.grad is not None)
    with pytest.raises(EchoTrlError, match="none of its 4 trajectories has a token to train"):
        make_trainer(tmp_path, ds, world_model_coeff=1.0, use_policy_loss=False)  # a whole dataset: refused
    world_only = make_trainer(tmp_path, dataset(4), world_model_coeff=1.0, use_policy_loss=False)
    wl = world_only._compute_loss(world_only.model, batch(world_only, ds))  # one batch without them
    assert wl.item() == 0.0 and wl.requires_grad
    wl.backward()  # graph-connected zero
    m = trl_compat.metrics(world_only, "train")
    assert m["world/tokens_env"] == [0.0] and "world/ce_env" not in m


def test_offline_advantages_by_group_and_each_trajectory_once_per_epoch(tmp_path):
    ts = [
        trajectory(0, 1.0, "a"),
        trajectory(1, 0.0, "a"),
        trajectory(2, 0.5, "b"),
        trajectory(3, 0.5, "b"),
        trajectory(4, 1.0, "solo"),
        trajectory(5, 0.2, "other"),
    ]
    ds = trajectories_to_dataset(ts)
    trainer = make_trainer(tmp_path, ds, per_device_train_batch_size=2, scale_rewards="group")
    adv = trainer.train_dataset[ADVANTAGE_COLUMN]
    assert adv == pytest.approx([0.5 / (0.70711 + 1e-4), -0.5 / (0.70711 + 1e-4), 0, 0, 0, 0], rel=1e-4)
    inputs = trainer._generate_and_score_completions(list(trainer.train_dataset)[:2])
    assert inputs["advantages"].tolist() == pytest.approx(adv[:2])
    sampler = trainer._get_train_sampler()
    indices = list(sampler)
    # each generation batch (2 rows) is repeated steps_per_generation x num_iterations = 1 times
    assert sorted(indices) == list(range(6)) and len(trainer.get_train_dataloader()) == 3


def test_offline_batch_scaling_divides_by_the_generation_batch_std(tmp_path):
    """scale_rewards='batch': centred by the dataset group, scaled by the collated batch's reward std (TRL)."""
    ts = [trajectory(0, 1.0, "a"), trajectory(1, 0.0, "a"), trajectory(2, 0.5, "b"), trajectory(3, 0.1, "b")]
    trainer = make_trainer(tmp_path, trajectories_to_dataset(ts), per_device_train_batch_size=2, scale_rewards="batch")
    rows = list(trainer.train_dataset)
    inputs = trainer._generate_and_score_completions([rows[0], rows[2]])  # rewards 1.0 and 0.5
    std = float(np.std([1.0, 0.5], ddof=1))
    assert inputs["advantages"].tolist() == pytest.approx([0.5 / (std + 1e-4), 0.2 / (std + 1e-4)], rel=1e-5)


def test_offline_keeps_recorded_completions_whole_unless_max_completion_length_is_set(tmp_path):
    """TRL's default max_completion_length would cut long recorded episodes silently; offline leaves it unset."""
    from trl import GRPOConfig

    from echo_trl.train.offline.recorded import check_settings

    trl_default = GRPOConfig.__dataclass_fields__["max_completion_length"].default
    long = trajectory(0, 1.0, "a")
    long.completion[1]["content"] = " ".join(f"item{k}" for k in range(trl_default))  # > TRL's default in tokens
    ds = trajectories_to_dataset([long, trajectory(1, 0.0, "a"), trajectory(2, 0.5, "b"), trajectory(3, 0.1, "b")])
    trainer = make_trainer(tmp_path, ds, max_completion_length=None)
    inputs = batch(trainer)
    assert inputs["completion_mask"][0].sum().item() > trl_default
    assert trainer._echo_settings.max_length == trainer.model.config.max_position_embeddings
    explicit = make_trainer(tmp_path, ds, max_completion_length=trl_default)
    assert batch(explicit)["completion_mask"][0].sum().item() <= trl_default
    online = tiny_config(tmp_path, max_completion_length=None)  # not set: the trainer fills it in
    assert online.max_completion_length is None
    tok = tiny_tokenizer("qwen3")
    prompts, rollout = prompt_dataset(), fixed_rollout(tok)
    zero = [lambda completions, **kw: [0.0] * len(completions)]
    EchoGRPOTrainer(tiny_model(), zero, online, prompts, processing_class=tok, rollout_func=rollout)
    assert online.max_completion_length == trl_default  # online generation keeps TRL's bound
    dr = tiny_config(tmp_path, loss_type="dr_grpo", per_device_train_batch_size=4, max_completion_length=None)
    with pytest.raises(EchoTrlError, match="dr_grpo.* divides by max_completion_length"):
        check_settings(dr, ds, offline=True, online=False)


def test_gradient_accumulation_is_exact(tmp_path):
    """Loss gradient of 4 trajectories in one micro-batch == accumulated over 2 micro-batches of 2."""
    from trl.trainer.utils import split_tensor_dict

    model = tiny_model()
    whole = make_trainer(
        tmp_path / "a", model=copy.deepcopy(model), world_model_coeff=0.5, world_loss_normalization="token"
    )
    whole._compute_loss(whole.model, batch(whole)).backward()
    split = make_trainer(
        tmp_path / "b",
        model=copy.deepcopy(model),
        world_model_coeff=0.5,
        world_loss_normalization="token",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
    )
    gen = batch(split)
    assert split.args.steps_per_generation == 2
    for part in split_tensor_dict(gen, 2):
        split._compute_loss(split.model, part).backward()
    for (name, a), b in zip(whole.model.named_parameters(), split.model.parameters(), strict=True):
        assert_same_gradient(b.grad, a.grad, name)


@pytest.mark.parametrize("normalization", ["token", "sequence"])
def test_accumulation_with_steps_per_generation_above_accumulation_is_exact_only_on_average(tmp_path, normalization):
    """steps_per_generation=4, gradient_accumulation_steps=2 (as documented in loss.py): one optimizer step's
    world gradient is the true window gradient x (window's count) / (generation batch's count x GA / spg)."""
    from trl.trainer.utils import split_tensor_dict

    from echo_trl.train.step.loss import global_count

    ts = [
        trajectory(0, 1.0, "a"),
        trajectory(1, 0.0, "a"),
        trajectory(2, 0.5, "b"),
        trajectory(3, 0.1, "b", empty_outputs=True),
    ]  # the last row has no world token
    ts[0].completion[1]["content"] = " ".join(f"item{k}" for k in range(40))
    trainer = make_trainer(
        tmp_path,
        trajectories_to_dataset(ts),
        world_model_coeff=0.5,
        world_loss_normalization=normalization,
        use_policy_loss=False,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
    )
    gen = batch(trainer)
    parts = split_tensor_dict(gen, 4)
    for part in parts[:2]:  # the first optimizer step's window
        trainer._compute_loss(trainer.model, part).backward()
    got = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.model.zero_grad()
    # the true loss of the window, from the model's own logits (float64 sums of the per-row CE)
    window = {
        k: torch.cat([p[k] for p in parts[:2]])
        for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "world_mask")
    }
    nll = -reference_logps(trainer.model, window).double() * window["world_mask"]
    per_row = nll.sum(-1) if normalization == "token" else nll.sum(-1) / window["world_mask"].sum(-1).clamp(min=1)
    n_window = global_count(window["world_mask"], normalization).item()
    (0.5 * per_row.sum() / n_window).backward()
    share = n_window / (global_count(gen["world_mask"], normalization).item() * 2 / 4)
    assert share != pytest.approx(1.0)  # the window holds more than its share of the world tokens / rows
    for g, p in zip(got, trainer.model.parameters(), strict=True):
        assert_same_gradient(g, p.grad * share)


def test_importance_ratio_uses_behavior_logprobs(tmp_path):
    trainer = make_trainer(tmp_path, behavior_policy="current")
    inputs = batch(trainer)
    assert "old_per_token_logps" not in inputs  # no recordings, "current": on-policy, as TRL without vLLM
    on_policy = trainer._compute_loss(trainer.model, inputs).item()
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attn, ids.size(1) - inputs["prompt_ids"].size(1)
        )
    action = inputs["tool_mask"].bool() & inputs["completion_mask"].bool()
    # The batch rows follow the dataset order (no shuffle in _generate_and_score_completions)
    recorded = [logps[i][action[i]].tolist() for i in range(len(logps))]
    ds_same = trajectories_to_dataset(
        [
            trajectory(i, [1.0, 0.0, 0.5, 0.1][i], f"g{i // 2}", warning=(i == 1), behavior=recorded[i])
            for i in range(4)
        ]
    )
    same = make_trainer(tmp_path, ds_same, model=trainer.model)
    same_inputs = batch(same)
    assert torch.isfinite(same_inputs["old_per_token_logps"][action]).all()
    assert same._compute_loss(same.model, same_inputs).item() == pytest.approx(on_policy, abs=1e-5)
    shifted = [[v - 0.5 for v in r] for r in recorded]  # behavior was less likely: ratio e^0.5 > 1 + epsilon
    ds_shift = trajectories_to_dataset(
        [trajectory(i, [1.0, 0.0, 0.5, 0.1][i], f"g{i // 2}", warning=(i == 1), behavior=shifted[i]) for i in range(4)]
    )
    off = make_trainer(tmp_path, ds_shift, model=trainer.model)
    off_loss = off._compute_loss(off.model, batch(off)).item()
    assert off_loss != pytest.approx(on_policy, abs=1e-4)
    assert trl_compat.metrics(off, "train")["clip_ratio/high_mean"][-1] > 0


def test_eval_reports_token_weighted_heldout_env_ce(tmp_path):
    from echo_trl.train.world_eval import evaluate_world_model

    held = trajectories_to_dataset([trajectory(10 + i, 0.5, f"h{i}", warning=(i == 0)) for i in range(5)])
    trainer = make_trainer(tmp_path, eval_dataset=held)
    metrics = trainer.evaluate()
    ref = evaluate_world_model(trainer.model, tiny_tokenizer("qwen3"), held)
    assert metrics["eval_world/ce_env"] == pytest.approx(ref["ce_env"], rel=1e-5)
    assert metrics["eval_world/ce_warning"] == pytest.approx(ref["ce_warning"], rel=1e-5)
    again = trainer.evaluate()  # totals restart with each evaluation
    assert again["eval_world/ce_env"] == pytest.approx(ref["ce_env"], rel=1e-5)
    # completions cut to max_completion_length (at a message end) are measured the same way by both
    from echo_trl.tokens.tokenization import tokenize_with_roles

    t = tokenize_with_roles(tiny_tokenizer("qwen3"), held[0])
    limit = t.message_token_spans[1][1] - t.prompt_length + 2  # room for the first call and its result only
    short = make_trainer(tmp_path, eval_dataset=held, model=trainer.model, max_completion_length=limit)
    cut = evaluate_world_model(short.model, tiny_tokenizer("qwen3"), held, max_completion_length=limit)
    assert 0 < cut["tokens_env"] < ref["tokens_env"]
    assert short.evaluate()["eval_world/ce_env"] == pytest.approx(cut["ce_env"], rel=1e-5)


@pytest.mark.parametrize("temperature, world_temperature", [(0.7, 0.7), (1.0, 0.5), (0.7, 0.5)])
def test_heldout_env_ce_is_at_temperature_one_whatever_the_training_temperatures(
    tmp_path, temperature, world_temperature
):
    """eval_world/ce_env is the paper's held-out CE (temperature 1), also when TRL samples at another temperature
    and the world term trains at yet another; the training metric stays the CE the world term trains on."""
    from echo_trl.train.world_eval import evaluate_world_model

    held = trajectories_to_dataset([trajectory(10 + i, 0.5, f"h{i}", warning=(i == 0)) for i in range(3)])
    trainer = make_trainer(
        tmp_path,
        eval_dataset=held,
        temperature=temperature,
        world_loss_temperature=world_temperature,
        world_loss_normalization="token",
        world_model_coeff=1.0,
        use_policy_loss=False,
    )
    ref = evaluate_world_model(trainer.model, tiny_tokenizer("qwen3"), held)
    metrics = trainer.evaluate()
    assert metrics["eval_world/ce_env"] == pytest.approx(ref["ce_env"], rel=1e-5)
    assert metrics["eval_world/ce_warning"] == pytest.approx(ref["ce_warning"], rel=1e-5)
    trainer.model.train()
    inputs = batch(trainer)
    trainer._compute_loss(trainer.model, inputs)
    at_world_t = reference_world_loss(trainer.model, inputs, "token", temperature=world_temperature).item()
    assert trl_compat.metrics(trainer, "train")["world/ce_env"][-1] == pytest.approx(at_world_t, rel=1e-5)


def test_eval_counts_each_heldout_trajectory_once(tmp_path):
    """Several processes: accelerate evens out the last eval batch of each with rows from the start of the
    eval set. A repeated row index (as gathered from such a batch) counts once, whatever the batch."""
    from echo_trl.train.world_eval import evaluate_world_model

    held = trajectories_to_dataset([trajectory(10 + i, float(i % 2), f"h{i // 2}", warning=(i < 2)) for i in range(3)])
    trainer = make_trainer(tmp_path, eval_dataset=held)
    trainer.model.eval()
    rows = [trainer.eval_dataset[i] for i in (0, 1, 0)]
    trainer._compute_loss(trainer.model, trainer._generate_and_score_completions(rows))
    trainer._compute_loss(trainer.model, trainer._generate_and_score_completions(rows[1:]))
    m, tok = trl_compat.metrics(trainer, "eval"), tiny_tokenizer("qwen3")
    ref = evaluate_world_model(trainer.model, tok, [held[0], held[1]])
    twice = evaluate_world_model(trainer.model, tok, [held[i] for i in (0, 1, 0, 1, 0)])
    assert twice["ce_env"] != pytest.approx(ref["ce_env"], rel=1e-4)  # the check below can tell them apart
    assert m["world/ce_env"] == [pytest.approx(ref["ce_env"], rel=1e-5)]
    assert m["world/ce_warning"] == [pytest.approx(ref["ce_warning"], rel=1e-5)]
    # evaluate() restarts the totals; trajectories passed to it get their row index as eval_dataset at init
    full = evaluate_world_model(trainer.model, tok, held)["ce_env"]
    for metrics in (trainer.evaluate(eval_dataset=held), trainer.evaluate()):
        assert metrics["eval_world/ce_env"] == pytest.approx(full, rel=1e-5)
        assert trainer._echo_eval.seen == {0, 1, 2}


def test_training_logs_world_metrics_and_filter_counters(tmp_path):
    ts = [trajectory(i, [1.0, 0.0, 0.5, 0.1][i], f"g{i // 2}", error=(i % 2 == 0), warning=(i == 1)) for i in range(4)]
    trainer = make_trainer(tmp_path, trajectories_to_dataset(ts), wm_filter_min_correct_pct=100)
    trainer.train()
    log = next(h for h in trainer.state.log_history if "world/ce_env" in h)
    for key in (
        "world/ce_warning",
        "world/loss_unscaled",
        "world/loss_scaled",
        "world/coeff",
        "world/tokens_env",
        "world/tokens_warning",
        "world/tokens_action",
        "world/filtered_rollouts",
        "world/filtered_frac",
    ):
        assert key in log, key
    assert log["world/filtered_rollouts"] == 2 and log["world/coeff"] == 0.05
    assert log["world/tokens_warning"] > 0 and log["world/tokens_env"] > 0
    assert log["world/loss_scaled"] == pytest.approx(0.05 * log["world/loss_unscaled"])


def test_clear_errors_for_unsupported_combinations(tmp_path):
    def tool(x: int) -> int:
        """Echo.

        Args:
            x: a number.
        """
        return x

    with pytest.raises(EchoTrlError, match="recorded trajectories"):
        EchoGRPOTrainer(
            tiny_model(),
            args=tiny_config(tmp_path),
            train_dataset=dataset(),
            processing_class=tiny_tokenizer("qwen3"),
            tools=[tool],
            reward_funcs=[lambda **k: [0.0]],
        )
    with pytest.raises(EchoTrlError, match="Liger"):
        EchoGRPOTrainer(
            tiny_model(),
            args=tiny_config(
                tmp_path, use_liger_kernel=True, liger_kernel_config={"fused_linear_cross_entropy": True}
            ),
            train_dataset=dataset(),
            processing_class=tiny_tokenizer("qwen3"),
        )
    with pytest.raises(EchoTrlError, match="EchoGRPOConfig"):
        from trl import GRPOConfig

        plain = GRPOConfig(
            str(tmp_path), per_device_train_batch_size=2, num_generations=2, use_cpu=True, report_to="none"
        )
        EchoGRPOTrainer(tiny_model(), args=plain, train_dataset=dataset(), processing_class=tiny_tokenizer("qwen3"))


# --------------------------------------------------------------------------------------------
# Online


def test_online_tool_loop_env_mask_is_tool_output_content(tmp_path, monkeypatch):
    """TRL's own multi-turn tool loop (scripted model turns): the env mask is the tool result, not the
    role header, <tool_response> tags or next generation prompt TRL also marks tool_mask == 0."""
    tok = tiny_tokenizer("qwen3")

    def lookup(city: str) -> str:
        """Weather of a city.

        Args:
            city: the city name.
        """
        return f"Sunny in {city}, 21 C"

    trainer = EchoGRPOTrainer(
        tiny_model(),
        reward_funcs=[lambda completions, **kw: [1.0] * len(completions)],
        args=tiny_config(tmp_path, max_completion_length=128, world_model_coeff=0.05),
        train_dataset=prompt_dataset(),
        processing_class=tok,
        tools=[lookup],
    )
    call = '<tool_call>\n{"name": "lookup", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    turns = iter([call, "It is sunny.<|im_end|>"])

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ids = tok(next(turns), add_special_tokens=False)["input_ids"]
        return [list(ids) for _ in prompt_ids], None

    monkeypatch.setattr(trainer, "_generate_single_turn", scripted)
    trainer.model.train()
    out = trainer._generate_and_score_completions(list(trainer.train_dataset))
    env, tmask, ids = out["env_output_mask"], out["tool_mask"], out["completion_ids"]
    for i in range(2):
        env_ids = ids[i][env[i].bool()].tolist()
        assert tok.decode(env_ids).strip() == "Sunny in Paris, 21 C"
        span = ids[i][(tmask[i] == 0) & out["completion_mask"][i].bool()].tolist()
        assert len(span) > len(env_ids) and "<tool_response>" in tok.decode(span)
    assert torch.equal(out["world_mask"], env)
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(trainer.model, out)
    assert torch.isfinite(loss)
    assert trl_compat.metrics(trainer, "train")["world/tokens_env"][-1] == env.sum().item()


def test_rollout_func_may_return_its_own_env_and_warning_masks(tmp_path):
    tok = tiny_tokenizer("qwen3")
    rollout = fixed_rollout(tok)
    trainer = EchoGRPOTrainer(
        tiny_model(),
        reward_funcs=[lambda completions, **kw: [1.0] * len(completions)],
        args=tiny_config(tmp_path, max_completion_length=64),
        train_dataset=prompt_dataset(),
        processing_class=tok,
        rollout_func=rollout,
    )
    trainer.model.train()
    out = trainer._generate_and_score_completions(list(trainer.train_dataset))
    n = out["completion_mask"][0].sum().item()
    assert out["env_output_mask"][0, :n].tolist() == [0] * 3 + [1] * (n - 4) + [0]
    assert out["warning_mask"][0, :n].tolist() == [0] * (n - 1) + [1]
    trainer.train()
    log = next(h for h in trainer.state.log_history if "world/tokens_env" in h)
    assert log["world/tokens_env"] == 2 * (n - 4) and log["world/tokens_warning"] == 2


def test_verifier_free_online_echo_needs_no_reward(tmp_path):
    tok = tiny_tokenizer("qwen3")
    trainer = EchoGRPOTrainer(
        tiny_model(),
        args=tiny_config(tmp_path, max_completion_length=64, use_policy_loss=False, world_model_coeff=1.0),
        train_dataset=prompt_dataset(),
        processing_class=tok,
        rollout_func=fixed_rollout(tok),
    )
    trainer.train()
    log = next(h for h in trainer.state.log_history if "world/loss_scaled" in h)
    assert log["loss"] == pytest.approx(log["world/loss_scaled"], rel=1e-4)  # world term only
    assert "clip_ratio/region_mean" not in log  # no policy term was computed


def test_online_sampler_is_trls_order_and_resumable(tmp_path):
    """Online (prompt dataset) the sampler keeps TRL's settings and order, and a fresh one told set_epoch(e),
    as Trainer does on resume, continues with epoch e's order (TRL's own replays epoch 0's)."""
    from trl import GRPOTrainer

    tok = tiny_tokenizer("qwen3")
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"q{i}"}] for i in range(6)]})
    trainer = EchoGRPOTrainer(
        tiny_model(),
        args=tiny_config(tmp_path, seed=3, max_completion_length=64),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        train_dataset=prompts,
        processing_class=tok,
        rollout_func=fixed_rollout(tok),
    )
    trl_sampler = GRPOTrainer._get_train_sampler(trainer, prompts)
    trl_epochs = [list(trl_sampler) for _ in range(3)]
    assert trl_epochs[0] != trl_epochs[1]
    ours = trainer._get_train_sampler()
    assert (ours.mini_repeat_count, ours.batch_size, ours.repeat_count) == (
        trl_sampler.mini_repeat_count,
        trl_sampler.batch_size,
        trl_sampler.repeat_count,
    )
    assert [list(ours) for _ in range(3)] == trl_epochs
    for e in (2, 1):
        fresh = trainer._get_train_sampler()
        fresh.set_epoch(e)
        assert list(fresh) == trl_epochs[e]


_DDP_SCRIPT = """
import os, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {tests!r})
import torch
from transformers import TrainerCallback
from helpers.trainer import dataset, tiny_config
from helpers.tiny import tiny_model, tiny_tokenizer
from echo_trl.trainer import EchoGRPOTrainer

per, out, norm, share = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"

class Grab(TrainerCallback):
    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save({{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}, out)

args = tiny_config(os.path.dirname(out), per_device_train_batch_size=per, shuffle_dataset=False, max_grad_norm=0.0,
                   world_loss_normalization=norm, world_model_coeff=0.5, prefix_sharing=share)
EchoGRPOTrainer(tiny_model(), args=args, train_dataset=dataset(4), processing_class=tiny_tokenizer("qwen3"),
                callbacks=[Grab()]).train()
# the trainer's DDP model collected before the group is destroyed, before exit (else gloo's threads can abort it)
from echo_trl.commands.support.launch_checks import leave_process_group
leave_process_group()
"""


@pytest.mark.parametrize("normalization", ["sequence"])
def test_two_processes_give_the_single_process_gradient(tmp_path, normalization):
    """Real data parallelism (torchrun, 2 CPU processes, gloo): the all-reduced gradient of 2 x 2 trajectories
    equals the gradient of the same 4 trajectories in one process (global counts, not per-process means); the
    two processes forward shared prefixes once (prefix_sharing), the one process does not."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "ddp_run.py"
    script.write_text(_DDP_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    single = subprocess.run(
        [sys.executable, str(script), "4", str(tmp_path / "single.pt"), normalization, "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            str(script),
            "2",
            str(tmp_path / "ddp.pt"),
            normalization,
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    a, b = torch.load(tmp_path / "single.pt"), torch.load(tmp_path / "ddp.pt")
    assert a.keys() == b.keys() and a
    for name in a:
        assert_same_gradient(b[name], a[name], name)


# --------------------------------------------------------------------------------------------
# Precision guards

FP16_WARNING = "fp16 weights or autocast"


@pytest.mark.parametrize(
    "dtype, flags",
    [(torch.bfloat16, {}), (torch.float16, {}), (torch.float32, {"bf16": True})],
    ids=["bf16-weights", "fp16-weights", "bf16-autocast"],
)
def test_half_precision_at_top_lambda_with_equal_rewards_logs_finite_exact_metrics(tmp_path, recwarn, dtype, flags):
    """Two steps at lambda = 1 with all-equal rewards (zero advantages: the world term is the whole loss), in
    bf16 / fp16: every logged world metric is finite and step 1's equal an independent CE from the model's own
    half-precision logits (upcast to float32) over the env-token mask. fp16 autocast is covered below
    (accelerate runs ``fp16=True`` in float32 on CPU)."""
    ds = trajectories_to_dataset([trajectory(i, 0.5, f"g{i // 2}") for i in range(4)])
    model = tiny_model().to(dtype)
    initial = copy.deepcopy(model)
    trainer = make_trainer(tmp_path, ds, model=model, world_model_coeff=1.0, max_steps=2, **flags)
    assert trainer.train_dataset[ADVANTAGE_COLUMN] == [0.0] * 4
    recwarn.clear()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "world/ce_env" in h]
    assert len(logs) == 2
    for log in logs:
        for key in ("loss", "grad_norm", *(k for k in log if k.startswith("world/"))):
            assert math.isfinite(log[key]), (key, log[key])
    inputs = batch(trainer)  # all 4 trajectories, as step 1 saw them (the means do not depend on row order)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(flags)):
        ce_env = reference_world_loss(initial, inputs, "token").item()
        world = reference_world_loss(initial, inputs, "sequence").item()
    # Same half-precision forward on both sides, reduced in float32; only the accumulation order differs (fused
    # head tiles + online log-sum-exp vs log_softmax): <= 1e-6 measured. A half-precision sum is ~1e-3 off.
    first = logs[0]
    assert first["world/ce_env"] == pytest.approx(ce_env, rel=1e-5)
    assert first["world/loss_unscaled"] == pytest.approx(world, rel=1e-5)
    assert first["loss"] == pytest.approx(world, rel=1e-5)  # zero advantages: the GRPO term is exactly 0
    assert logs[1]["world/ce_env"] < ce_env  # and the update trained the world model
    fp16 = [w for w in recwarn if FP16_WARNING in str(w.message)]
    assert len(fp16) == (1 if dtype == torch.float16 else 0)  # once per run, and only for fp16


def test_fp16_autocast_warns_once_bf16_autocast_does_not(tmp_path, recwarn):
    trainer = make_trainer(tmp_path)
    inputs = batch(trainer)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        trainer._compute_loss(trainer.model, inputs)
    assert not [w for w in recwarn if FP16_WARNING in str(w.message)]
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = trainer._compute_loss(trainer.model, inputs)
    assert torch.isfinite(loss)
    assert len([w for w in recwarn if FP16_WARNING in str(w.message)]) == 1


def test_non_finite_log_prob_at_one_env_token_stops_training_before_the_update(tmp_path, monkeypatch):
    """NaN at one env token only (the action tokens are fine): an error naming the step and the quantity,
    raised in the first micro-batch, before any optimizer step (the weights are unchanged)."""

    trainer = make_trainer(tmp_path, world_model_coeff=0.05, shuffle_dataset=False)
    row, col = batch(trainer)["env_output_mask"].nonzero()[0].tolist()  # unshuffled: training sees this batch
    forward = trl_compat.shared_forward  # the loss forward of this trainer (prefix_sharing)

    def with_nan(*args, **kwargs):
        shared = forward(*args, **kwargs)
        logps = shared.logps.clone()
        logps[row, col] = float("nan")
        return dataclasses.replace(shared, logps=logps)

    monkeypatch.setattr(trl_compat, "shared_forward", with_nan)
    before = copy.deepcopy(trainer.model.state_dict())
    with pytest.raises(
        EchoTrlError,
        match=r"optimizer step 1: the world-model cross-entropy on environment-output "
        r"tokens is nan .*GRPO term is non-finite too.*bf16",
    ):
        trainer.train()
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_real_fp16_logit_overflow_stops_training_with_finite_weights(tmp_path, recwarn):
    """fp16 weights whose logits pass 65504 (final norm and LM head scaled up). Without the guard one step made
    all 24 weight tensors NaN while the Trainer logged the loss as 0; with it, training stops at step 1. With
    behavior_policy="initial" the starting model's log-probs (computed at init) are NaN already: refused, where
    they used to become "ratio 1" silently."""
    model = tiny_model().to(torch.float16)
    with torch.no_grad():
        model.model.norm.weight.mul_(2e4)
        model.lm_head.weight.mul_(10)  # tied to the input embeddings
    with pytest.raises(EchoTrlError, match=r"echo_initial_logprobs\[0\]: the starting model's log-prob is nan"):
        batch(make_trainer(tmp_path, model=model, world_model_coeff=0.05))
    trainer = make_trainer(tmp_path, model=model, world_model_coeff=0.05, behavior_policy="current")
    inputs = batch(trainer)
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        logits = model(input_ids=ids, attention_mask=torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1))
    assert torch.isinf(logits.logits).any()  # the premise: this forward overflows fp16
    with pytest.raises(EchoTrlError, match="optimizer step 1: .* is nan .*fp16 overflow"):
        trainer.train()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert len([w for w in recwarn if FP16_WARNING in str(w.message)]) == 1
