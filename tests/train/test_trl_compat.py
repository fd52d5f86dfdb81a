"""The TRL internals ``echo_trl.train.trl_compat`` relies on still exist, with the shapes it expects (and the
fields and shuffling of TRL's ``RepeatSampler`` that ``echo_trl.train.sampler`` builds on).

Each test names what moved when it fails: run this file first after upgrading TRL.
"""

from __future__ import annotations

import inspect
import math
import re
import tomllib
from pathlib import Path

import pytest
import torch
import trl
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import batch, fixed_rollout, make_trainer, prompt_dataset, tiny_config
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from echo_trl.train import trl_compat
from echo_trl.train.batch import LossForward
from echo_trl.train.sampler import ResumableRepeatSampler
from echo_trl.trainer import EchoGRPOTrainer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

#: Private GRPOTrainer methods ECHO overrides or calls, with the leading parameters it passes or expects.
HOOKS = {
    "_generate": ["self", "prompts"],
    "_generate_and_score_completions": ["self", "inputs"],
    "_compute_loss": ["self", "model", "inputs"],
    "_get_per_token_logps_and_entropies": [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
        *trl_compat.FORWARD_KWARGS,
    ],
    "_get_train_sampler": ["self", "dataset"],
    "_get_eval_sampler": ["self", "eval_dataset"],
    "_set_signature_columns_if_needed": ["self"],
    "_save_rng_state": ["self", "output_dir"],
    "_load_rng_state": ["self", "checkpoint"],
    "_get_tool_suffix_ids": ["self", "tool_messages"],
    "_prepare_inputs": ["self", "generation_batch"],
    "_tool_call_loop": [
        "self",
        "prompts",
        "prompt_ids",
        "completion_ids",
        "completions",
        "logprobs",
        "images",
        "multimodal_fields",
    ],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "log": ["self", "logs", "start_time"],
}


def test_tool_loop_and_environment_rewards_are_read_as_the_concurrent_path_expects():
    """What ``concurrent_tool_calls`` / ``verify_concurrently`` rely on in TRL 1.16: the tool loop reads each
    rollout's sync tools from ``self._sync_tool_dicts[idx]`` and calls them with the parsed arguments, in the order
    of the last assistant message's ``tool_calls`` (a list TRL appends tool messages to only after the calls), and
    an environment's reward is its ``get_reward()``."""
    loop = inspect.getsource(GRPOTrainer._tool_call_loop)
    assert "sync_tool_dict = self._sync_tool_dicts[idx_with_tool]" in loop
    assert 'sync_tool_dict[name](**function["arguments"])' in loop
    assert loop.index("for tool_call in tool_call_list:") < loop.index(
        "completions[idx_with_tool].append(tool_message)"
    )
    assert 'completion.get("tool_calls")' in loop and "completions[idx_with_tool].append(post_tool_completions" in loop
    assert "e.get_reward() if type(e) is _env_type" in inspect.getsource(GRPOTrainer.__init__)


def test_prepare_inputs_shuffles_then_splits_through_module_globals():
    """micro_batch_order swaps ``shuffle_sequence_dict`` in TRL's grpo_trainer module: TRL 1.16's
    ``_prepare_inputs`` must still call it by that global name, before ``split_tensor_dict``, and TRL's shuffle must
    still draw one ``torch.randperm`` of the rows (the online group shuffle consumes the same draw)."""
    import trl.trainer.grpo_trainer as grpo
    from trl.trainer.utils import shuffle_sequence_dict

    source = inspect.getsource(GRPOTrainer._prepare_inputs)
    assert source.index("shuffle_sequence_dict(") < source.index("split_tensor_dict(")
    assert "torch.randperm(batch_size)" in inspect.getsource(shuffle_sequence_dict)
    original = grpo.shuffle_sequence_dict
    with trl_compat.micro_batch_order(offline=True, share=False):
        batch = {"x": torch.arange(6)}
        assert grpo.shuffle_sequence_dict(batch) is batch
    assert grpo.shuffle_sequence_dict is original
    with trl_compat.micro_batch_order(offline=False, share=False):
        assert grpo.shuffle_sequence_dict is original
    # online with sharing: groups (equal unpadded prompts, next to each other) move whole, from TRL's own draw
    prompt_ids = torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9], [0, 0, 4], [0, 0, 4]])
    prompt_mask = (prompt_ids != 0).long()
    batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "row": list(range(6)), "n": torch.tensor(3)}
    torch.manual_seed(1)
    rows = torch.randperm(6).tolist()
    with trl_compat.micro_batch_order(offline=False, share=True):
        torch.manual_seed(1)
        out = grpo.shuffle_sequence_dict(batch)
        after = torch.rand(1)
    torch.manual_seed(1)
    torch.randperm(6)
    assert torch.equal(after, torch.rand(1))  # the random stream advanced exactly as TRL's shuffle advances it
    blocks = sorted({r // 2 for r in rows}, key=lambda b: min(rows.index(2 * b), rows.index(2 * b + 1)))
    assert out["row"] == [r for b in blocks for r in (2 * b, 2 * b + 1)]
    assert torch.equal(out["prompt_ids"], prompt_ids[out["row"]]) and out["n"] is batch["n"]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def test_installed_trl_is_in_the_range_this_module_is_written_for():
    low, high = trl_compat.TRL_VERSION_RANGE
    assert _version(low) <= _version(trl.__version__) < _version(high), (
        f"TRL {trl.__version__} is outside {low} <= version < {high}: re-check echo_trl/train/trl_compat.py"
    )
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    pin = next(d for d in pyproject["project"]["dependencies"] if d.startswith("trl"))
    assert _version(pin.split(">=")[1]) == _version(low) and _version(pin.split("<")[1]) == _version(high), pin


@pytest.mark.parametrize("name", list(HOOKS))
def test_private_hooks_keep_their_signatures(name):
    assert hasattr(GRPOTrainer, name), f"GRPOTrainer.{name} is gone"
    params = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    assert params[: len(HOOKS[name])] == HOOKS[name], f"GRPOTrainer.{name}{params} moved"


def test_private_attributes_exist_with_the_expected_shapes(tmp_path):
    trainer = make_trainer(tmp_path)
    tok = tiny_tokenizer("qwen3")
    assert trl_compat.tokenizer(trainer).pad_token_id == tok.pad_token_id
    assert trl_compat.is_vlm(trainer) is False
    metrics = trl_compat.metrics(trainer, "train")
    metrics["probe"].append(1.0)  # a defaultdict(list) per mode
    assert trainer._metrics["train"]["probe"] == [1.0] and trl_compat.metrics(trainer, "eval") == {}
    assert trainer._step == 0 and trainer._buffered_inputs is None
    trainer._set_signature_columns_if_needed()
    assert {"completion", "reward", "echo_eval_index"} <= set(trainer._signature_columns)


def test_grpo_citation_is_trls_bibtex_entry():
    citation = trl_compat.grpo_citation()
    assert citation is not None and citation.lstrip().startswith("@") and "DeepSeekMath" in citation


def test_generate_returns_the_8_tuple_generated_rollouts_unpacks(tmp_path):
    """A rollout_func with known ids and an extra field: TRL's ``_generate`` passes them through in the
    positions ``generated_rollouts`` reads."""
    tok = tiny_tokenizer("qwen3")
    trainer = EchoGRPOTrainer(
        tiny_model(),
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=tiny_config(tmp_path, max_completion_length=64),
        train_dataset=prompt_dataset(),
        processing_class=tok,
        rollout_func=fixed_rollout(tok),
    )
    expected = fixed_rollout(tok)([None, None], trainer)
    result = GRPOTrainer._generate(trainer, [row["prompt"] for row in prompt_dataset()])
    assert isinstance(result, tuple) and len(result) == 8
    got = trl_compat.generated_rollouts(result)
    assert [list(ids) for ids in got.completion_ids] == expected["completion_ids"]
    assert [list(m) for m in got.tool_mask] == expected["env_mask"]
    assert [list(m) for m in got.extra_fields["env_output_mask"]] == expected["env_output_mask"]
    assert len(got.completions) == 2


def test_compute_loss_runs_one_forward_the_trainer_records(tmp_path):
    """TRL's ``_compute_loss`` computes its log-probs with exactly one ``_get_per_token_logps_and_entropies``
    call; the trainer's override records it (the loss forward ``_compute_loss`` set up) and fills NaN old
    log-probs in before TRL reads them."""
    trainer = make_trainer(tmp_path, prefix_sharing=False)  # TRL's own forward, counted below
    inputs = batch(trainer)
    calls = []
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    inputs = dict(inputs, old_per_token_logps=torch.full(inputs["completion_ids"].shape, math.nan))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", counting)
        trainer._echo_loss_forward = forward = LossForward(inputs)
        loss = GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
    assert calls == [1] and torch.isfinite(loss)
    assert trainer._echo_loss_forward is None  # recorded once: later forwards are TRL's own
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        ref = trl_compat.policy_logps(trainer, trainer.model, ids, attn, inputs["completion_ids"].size(1))
    torch.testing.assert_close(forward.logps.detach(), ref)
    torch.testing.assert_close(inputs["old_per_token_logps"], ref)  # on-policy: ratio 1


def test_generation_buffer_round_trips_through_a_checkpoint(tmp_path):
    trainer = make_trainer(tmp_path, per_device_train_batch_size=2, steps_per_generation=2)
    trainer._step, trainer._buffered_inputs = 3, [{"x": torch.arange(3)}]
    trl_compat.save_generation_buffer(trainer, str(tmp_path))
    trainer._step, trainer._buffered_inputs = 0, None
    trl_compat.load_generation_buffer(trainer, str(tmp_path))
    assert trainer._step == 3 and torch.equal(trainer._buffered_inputs[0]["x"], torch.arange(3))


def test_repeat_sampler_fields_the_resumable_sampler_copies():
    trl_sampler = RepeatSampler(data_source=range(6), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=1)
    ours = ResumableRepeatSampler.like(trl_sampler)
    assert type(ours) is ResumableRepeatSampler
    for field in ("data_source", "mini_repeat_count", "batch_size", "repeat_count", "shuffle", "seed", "num_samples"):
        assert getattr(ours, field) == getattr(trl_sampler, field), field
    assert isinstance(trl_sampler.generator, torch.Generator)
    assert list(ours) == list(
        RepeatSampler(data_source=range(6), mini_repeat_count=2, batch_size=3, repeat_count=2, seed=1)
    )


def test_sampler_order_of_epoch_e_is_trls_and_needs_no_earlier_epochs():
    """The offline sampler gives TRL's order in every epoch of an uninterrupted run, and a fresh sampler told
    ``set_epoch(e)`` (what Trainer does on resume) gives epoch e's order, where TRL's replays epoch 0's."""

    def kw():
        return dict(data_source=range(12), mini_repeat_count=1, batch_size=4, repeat_count=2, shuffle=True, seed=7)

    trl = RepeatSampler(**kw())
    trl_epochs = [list(trl) for _ in range(3)]
    assert trl_epochs[0] != trl_epochs[1] != trl_epochs[2]
    ours = ResumableRepeatSampler(**kw())
    assert [list(ours) for _ in range(3)] == trl_epochs  # without set_epoch: consecutive epochs, as TRL's
    for e in (2, 0, 1):
        fresh = ResumableRepeatSampler(**kw())
        fresh.set_epoch(e)
        assert list(fresh) == trl_epochs[e]
    assert list(RepeatSampler(**kw())) == trl_epochs[0]  # TRL's fresh sampler: epoch 0 whatever the epoch
