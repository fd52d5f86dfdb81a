"""A dataset with no trainable token is refused; a batch without one is a warning (echo_trl.train.step.trainable).

Empty or tool-only completions used to "train" to a bit-identical model with exit 0, for `train` and `sft`.
"""

from __future__ import annotations

import logging

import pytest
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import make_trainer, trajectory

from echo_trl.data.build import trajectories_to_dataset
from echo_trl.errors import EchoTrlError
from echo_trl.roles import Trajectory
from echo_trl.sft_config import EchoSFTConfig
from echo_trl.sft_trainer import EchoSFTTrainer
from echo_trl.train.step.trainable import require_trainable_tokens

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def untrainable(i: int, completion=None, warnings=None) -> Trajectory:
    """No assistant turn; by default one tool message with empty content (so no environment-output token)."""
    completion = [{"role": "tool", "name": "search", "content": ""}] if completion is None else completion
    return Trajectory(
        prompt=[{"role": "system", "content": "Shop agent."}, {"role": "user", "content": f"Buy item {i}."}],
        completion=completion,
        warnings=warnings or [[] for _ in completion],
        reward=float(i % 2),
        group_id=f"e{i // 2}",
        scenario="empty",
        task_idx=i,
    )


def test_the_whole_dataset_check_follows_the_active_loss_terms():
    tool_only = trajectories_to_dataset([untrainable(i) for i in range(3)])
    with pytest.raises(EchoTrlError, match=r"^train_dataset: none of its 3 trajectories has a token to train: "):
        require_trainable_tokens(tool_only, "train_dataset", actions=True, world_target="env_only")
    # the template tokens around a tool message are world targets of "observation" and "all"
    require_trainable_tokens(tool_only, "train_dataset", actions=False, world_target="observation")
    empty = trajectories_to_dataset([untrainable(i, completion=[]) for i in range(2)])
    for target in ("env_only", "observation", "all", None):
        with pytest.raises(EchoTrlError, match="none of its 2 trajectories"):
            require_trainable_tokens(empty, "train_dataset", actions=True, world_target=target)
    with_output = trajectories_to_dataset(
        [untrainable(0), untrainable(1, completion=[{"role": "tool", "name": "s", "content": "out"}])]
    )
    require_trainable_tokens(with_output, "x", actions=False, world_target="env_only")  # row 1 trains the world
    with pytest.raises(EchoTrlError, match="no completion holds an assistant message"):
        require_trainable_tokens(with_output, "x", actions=True, world_target=None)  # world term off
    warned = trajectories_to_dataset([untrainable(0, warnings=[["rate limited"]])])
    require_trainable_tokens(warned, "x", actions=False, world_target="all")
    with pytest.raises(EchoTrlError):
        require_trainable_tokens(warned, "x", actions=False, world_target="env_only")
    one_action = trajectories_to_dataset([untrainable(0), trajectory(1, 1.0, "g")])
    require_trainable_tokens(one_action, "x", actions=True, world_target=None)


@pytest.mark.parametrize("completion", [[], None], ids=["empty", "tool-only"])
def test_grpo_and_sft_trainers_refuse_a_dataset_without_a_trainable_token(tmp_path, completion):
    ds = trajectories_to_dataset([untrainable(i, completion=completion) for i in range(4)])
    with pytest.raises(EchoTrlError, match=r"^train_dataset: none of its 4 trajectories has a token to train"):
        make_trainer(tmp_path, ds, world_model_coeff=0.05)
    args = EchoSFTConfig(str(tmp_path / "sft"), use_cpu=True, report_to="none", max_steps=1)
    with pytest.raises(EchoTrlError, match=r"^train_dataset: none of its 4 trajectories has a token to train"):
        EchoSFTTrainer(tiny_model(), args=args, train_dataset=ds, processing_class=tiny_tokenizer("qwen3"))


def test_a_batch_without_a_trainable_token_is_a_warning_naming_its_rows(tmp_path, caplog):
    """Rows 0-3 are tool-only (empty outputs), rows 4-7 ordinary: with the dataset order kept, the first batch of 4
    trains nothing and says so; the second trains and says nothing."""
    rows = [untrainable(i) for i in range(4)] + [trajectory(i, [1.0, 0.0][i % 2], f"g{i // 2}") for i in range(4, 8)]
    trainer = make_trainer(tmp_path, trajectories_to_dataset(rows), max_steps=2, shuffle_dataset=False)
    with caplog.at_level(logging.WARNING, logger="echo_trl"):
        trainer.train()
    warned = [r.getMessage() for r in caplog.records if "no trainable token" in r.getMessage()]
    assert warned == [
        "step 1: no trainable token in rows 0, 1, 2, 3 of train_dataset: no action token (GRPO term) and no "
        "world-target token after truncation and filters; this batch contributes no gradient"
    ]


def test_an_sft_batch_without_a_trainable_token_is_a_warning(tmp_path, caplog):
    """TRL's preparation drops the rows without a trained label (a tool-only completion still trains the template
    tokens around its tool message, as SFTTrainer does), so the warning is for a batch whose labels TRL's collator
    leaves all -100: the EchoSFTTrainer's collator says so."""
    rows = [untrainable(i) for i in range(2)] + [trajectory(i, 1.0, f"g{i}") for i in range(2, 4)]
    args = EchoSFTConfig(str(tmp_path / "sft"), use_cpu=True, report_to="none", max_steps=2)
    trainer = EchoSFTTrainer(
        tiny_model(), args=args, train_dataset=trajectories_to_dataset(rows), processing_class=tiny_tokenizer("qwen3")
    )
    prepared = [dict(r) for r in trainer.train_dataset.select_columns(["input_ids", "labels"])]
    trainer.model.train()
    with caplog.at_level(logging.WARNING, logger="echo_trl"):
        trainer.data_collator(prepared[:2])
        trainer.data_collator([{**r, "labels": [-100] * len(r["labels"])} for r in prepared[:2]])
    warned = [r.getMessage() for r in caplog.records if "no trainable token" in r.getMessage()]
    assert warned == ["step 1: no trainable token in this batch of 2 rows (every label is -100)"]


def test_a_dataset_whose_world_term_has_no_token_trains_its_actions_with_a_one_line_warning(caplog):
    """A collection of empty replies: assistant turns (action tokens) and no environment output; the run trains
    the actions, and says once that lambda * CE(env) has nothing to train."""
    answered_only = [
        untrainable(i, completion=[{"role": "assistant", "content": ""}], warnings=[[]]) for i in range(3)
    ]
    ds = trajectories_to_dataset(answered_only)
    with caplog.at_level(logging.WARNING, logger="echo_trl.train.step.trainable"):
        require_trainable_tokens(ds, "train_dataset", actions=True, world_target="env_only")
    (record,) = caplog.records
    assert record.getMessage().startswith("train_dataset: none of its 3 trajectories holds a tool message with")
    assert "the world-model term trains nothing" in record.getMessage() and "\n" not in record.getMessage()
    caplog.clear()
    with_output = trajectories_to_dataset([*answered_only, trajectory(3, 1.0, "g")])  # one row has env output
    with caplog.at_level(logging.WARNING, logger="echo_trl.train.step.trainable"):
        require_trainable_tokens(with_output, "train_dataset", actions=True, world_target="env_only")
        require_trainable_tokens(ds, "train_dataset", actions=True, world_target=None)  # world term off: no word
    assert not caplog.records
