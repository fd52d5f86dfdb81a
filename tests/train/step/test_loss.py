"""The pure world term: values, zero-token batches, exactness under accumulation / processes, schedules."""

from __future__ import annotations

import math

import pytest
import torch

from echo_trl.train.batch import CompletionMasks
from echo_trl.train.step.loss import (
    WorldTotals,
    divisor_for,
    global_count,
    nll_sum_and_count,
    world_coeff_at,
    world_loss,
    world_totals,
)


def _batch(seed=0, b=4, t=7):
    g = torch.Generator().manual_seed(seed)
    logps = -torch.rand(b, t, generator=g) * 5
    mask = torch.rand(b, t, generator=g) > 0.5
    mask[1] = False  # one trajectory without world tokens
    return logps, mask


def test_token_and_sequence_means_match_hand_computation():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 1]])
    tok = world_loss(logps, mask, normalization="token")
    assert tok.loss.item() == pytest.approx((1 + 2 + 6) / 3)
    seq = world_loss(logps, mask, normalization="sequence")
    assert seq.loss.item() == pytest.approx(((1 + 2) / 2 + 6) / 2)
    s, n = nll_sum_and_count(logps, mask)
    assert (s.item(), n.item()) == (9.0, 3.0)


def _echo_rl_reference(logps, mask) -> float:
    """echo-rl's sequence normalisation in float64 Python: per-row mean CE over world tokens, summed, / all rows."""
    rows = [
        [-float(v) for v, m in zip(lp, mk, strict=True) if m]
        for lp, mk in zip(logps.tolist(), mask.tolist(), strict=True)
    ]
    return sum(sum(r) / len(r) for r in rows if r) / len(rows)


def test_all_sequences_is_echo_rl_and_sequence_skips_rows_without_world_tokens():
    logps = torch.tensor([[-2.0, -4.0], [-1.0, -1.0], [-3.0, -3.0], [-5.0, -5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [0, 0], [1, 1], [0, 0]])  # 2 of 4 rows without world tokens
    echo_rl = world_loss(logps, mask, normalization="all_sequences")
    assert echo_rl.loss.item() == pytest.approx(_echo_rl_reference(logps, mask), rel=1e-12) == 1.5
    assert world_loss(logps, mask, normalization="sequence").loss.item() == pytest.approx(3.0, rel=1e-12)
    g_logps, g_mask = _batch(b=6)
    got = world_loss(g_logps.double(), g_mask, normalization="all_sequences").loss.item()
    assert got == pytest.approx(_echo_rl_reference(g_logps.double(), g_mask), rel=1e-12)
    assert global_count(g_mask, "all_sequences").item() == 6


@pytest.mark.parametrize("normalization", ["token", "sequence", "all_sequences"])
def test_no_world_tokens_gives_a_connected_zero_not_nan(normalization):
    logps = torch.randn(3, 5, requires_grad=True)
    out = world_loss(logps, torch.zeros(3, 5, dtype=torch.bool), normalization=normalization)
    assert out.loss.item() == 0.0 and out.loss.requires_grad
    out.loss.backward()
    assert torch.equal(logps.grad, torch.zeros_like(logps))
    # also with a global divisor of 0 (no world tokens anywhere in the generation batch)
    logps.grad = None
    out = world_loss(
        logps,
        torch.zeros(3, 5, dtype=torch.bool),
        normalization=normalization,
        divisor=divisor_for(
            torch.tensor(0.0), num_processes=2, gradient_accumulation_steps=2, steps_per_generation=2, training=True
        ),
    )
    out.loss.backward()
    assert not torch.isnan(out.loss) and torch.equal(logps.grad, torch.zeros_like(logps))


def test_masked_out_nan_or_inf_never_leaks():
    logps = torch.tensor([[-1.0, float("nan"), -float("inf")]], requires_grad=True)
    out = world_loss(logps, torch.tensor([[1, 0, 0]]), normalization="token")
    out.loss.backward()
    assert out.loss.item() == 1.0 and torch.equal(logps.grad, torch.tensor([[-1.0, 0.0, 0.0]]))


@pytest.mark.parametrize("normalization", ["token", "sequence", "all_sequences"])
@pytest.mark.parametrize("processes, accumulation", [(1, 1), (1, 4), (2, 2), (4, 1)])
def test_exact_under_gradient_accumulation_and_data_parallel(normalization, processes, accumulation):
    """Sum over micro-batches, mean over processes (DDP) == the full-batch mean, for any split."""
    logps, mask = _batch(b=8)
    full_logps = logps.clone().requires_grad_(True)
    world_loss(full_logps, mask, normalization=normalization).loss.backward()
    reference = full_logps.grad

    split_logps = logps.clone().requires_grad_(True)
    count = global_count(mask, normalization)  # gathered over the generation batch and every process
    per_process = 8 // processes
    micro = per_process // accumulation
    grads_per_process = []
    for p in range(processes):
        acc = torch.zeros_like(logps)
        for k in range(accumulation):
            rows = slice(p * per_process + k * micro, p * per_process + (k + 1) * micro)
            divisor = divisor_for(
                count,
                num_processes=processes,
                gradient_accumulation_steps=accumulation,
                steps_per_generation=accumulation,
                training=True,
            )
            part = split_logps[rows]
            (g,) = torch.autograd.grad(
                world_loss(part, mask[rows], normalization=normalization, divisor=divisor).loss, part
            )
            acc[rows] += g
        grads_per_process.append(acc)
    ddp = sum(grads_per_process) / processes  # DDP all-reduce averages gradients
    torch.testing.assert_close(ddp, reference)


def test_micro_batch_mean_without_divisor_is_not_the_batch_mean():
    """The naive per-micro-batch mean is biased when token counts differ: why the global count exists."""
    logps = torch.tensor([[-1.0, -1.0, -1.0], [-4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    naive = sum(world_loss(logps[i : i + 1], mask[i : i + 1], normalization="token").loss for i in range(2)) / 2
    exact = world_loss(logps, mask, normalization="token").loss
    assert naive.item() == pytest.approx(2.5) and exact.item() == pytest.approx(7 / 4)


def test_eval_divisor_is_not_rescaled():
    c = torch.tensor(12.0)
    assert (
        divisor_for(c, num_processes=2, gradient_accumulation_steps=4, steps_per_generation=2, training=False).item()
        == 6.0
    )
    assert (
        divisor_for(c, num_processes=2, gradient_accumulation_steps=4, steps_per_generation=2, training=True).item()
        == 12.0
    )


def test_schedules():
    assert world_coeff_at(99, coeff=0.05) == 0.05
    lin = dict(coeff=0.1, schedule="linear_decay", end=0.0, steps=[10])
    assert [world_coeff_at(s, **lin) for s in (0, 5, 10, 50)] == pytest.approx([0.1, 0.05, 0.0, 0.0])
    assert world_coeff_at(25, coeff=0.1, schedule="linear_decay", end=0.02, max_steps=100) == pytest.approx(0.08)
    step = dict(coeff=0.1, schedule="step_decay", steps=[10, 20], values=[0.05, 0.01])
    assert [world_coeff_at(s, **step) for s in (0, 9, 10, 19, 20, 1000)] == [0.1, 0.1, 0.05, 0.05, 0.01, 0.01]
    assert not math.isnan(world_coeff_at(0, coeff=0.1, schedule="linear_decay", max_steps=0))


@pytest.mark.parametrize("normalization", ["token", "sequence", "all_sequences"])
@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 8192), (torch.float16, 65536)])
def test_half_precision_logps_are_summed_in_float32(dtype, n, normalization):
    """bf16 / fp16 log-probs: loss, metric sums and gradients against a float64 reference of the same values."""
    g = torch.Generator().manual_seed(0)
    values = (-6 * torch.rand(8, n // 8, generator=g, dtype=torch.float64)).to(dtype)
    mask = torch.rand(8, n // 8, generator=g) > 0.1
    nll64 = torch.where(mask, -values.double(), 0.0)  # the same (already rounded) values, exactly, in float64
    per_seq_count = mask.sum(-1).double()
    if normalization == "token":
        expected, expected_grad = nll64.sum() / mask.sum(), torch.where(mask, -1.0 / mask.sum().double(), 0.0)
    else:
        expected = (nll64.sum(-1) / per_seq_count).mean()
        expected_grad = torch.where(mask, -1.0 / (8 * per_seq_count).unsqueeze(-1), 0.0)
    # What this guards against: summed in half precision, 8k bf16 CEs are rounded ~0.2% off, 64k fp16 ones overflow.
    half_sum = (-values).masked_fill(~mask, 0.0).sum().double()
    assert not abs(half_sum - nll64.sum()) / nll64.sum() < 1e-3

    logps = values.clone().requires_grad_(True)
    out = world_loss(logps, mask, normalization=normalization)
    # float32 accumulation of <= 64k terms: ~1e-7 relative measured, 1e-6 allowed
    assert out.loss.dtype == torch.float32
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert out.local_mean.item() == pytest.approx(expected.item(), rel=1e-6)
    s, count = nll_sum_and_count(logps, mask)
    assert s.item() == pytest.approx(nll64.sum().item(), rel=1e-6) and count.item() == mask.sum().item()
    out.loss.backward()  # the cast is differentiable: the gradient reaches the half-precision log-probs
    assert logps.grad.dtype == dtype
    torch.testing.assert_close(logps.grad.double(), expected_grad, rtol=2**-8, atol=0.0)  # half rounding


def test_completion_masks_cover_completion_tokens_only_and_default_to_empty():
    batch = {
        "completion_mask": torch.tensor([[1, 1, 1, 0]]),
        "tool_mask": torch.tensor([[1, 0, 1, 1]]),
        "env_output_mask": torch.tensor([[0, 1, 0, 1]]),  # the last token is padding
    }
    masks = CompletionMasks.of(batch)
    assert masks.env_output.tolist() == [[False, True, False, False]]
    assert masks.action.tolist() == [[True, False, True, False]]
    assert not masks.world.any() and not masks.warning.any()  # absent from the batch
    assert masks.scored.tolist() == masks.env_output.tolist()
    untooled = CompletionMasks.of({"completion_mask": batch["completion_mask"]})
    assert untooled.action.tolist() == [[True, True, True, False]]  # no tool loop: every completion token


def test_world_totals_are_the_named_sums_added_over_processes():
    logps = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-0.5, -1.5, -2.5, -3.5]])
    masks = CompletionMasks(
        world=torch.tensor([[0, 1, 0, 0], [1, 1, 0, 0]]).bool(),
        env_output=torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]]).bool(),
        warning=torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]]).bool(),
        action=torch.tensor([[1, 0, 0, 0], [0, 0, 1, 1]]).bool(),
    )
    wl = world_loss(logps, masks.world, normalization="token")
    processes = 3  # every process holding this same micro-batch: the all-reduce multiplies each sum by 3
    totals = world_totals(logps, masks, wl, lambda t: t * processes)
    assert totals == WorldTotals(
        env_nll=3 * (2 + 3 + 0.5 + 1.5),
        env_tokens=3 * 4,
        warning_nll=3 * 4.0,
        warning_tokens=3 * 1,
        loss_numerator=3 * (2 + 0.5 + 1.5),
        loss_count=3 * 3,
        action_tokens=3 * 3,
    )
