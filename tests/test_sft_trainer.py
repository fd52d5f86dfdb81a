"""EchoSFTTrainer on a tiny model: its loss against an independent per-token computation and against TRL's own
SFTTrainer, its masks against EchoGRPOTrainer's, gradient accumulation, reward filtering, LoRA and exact resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import batch as grpo_batch
from helpers.trainer import dataset, make_trainer

from echo_trl.roles import Role
from echo_trl.sft_config import EchoSFTConfig
from echo_trl.sft_trainer import EchoSFTTrainer
from echo_trl.tokens.tokenization import tokenize_with_roles

BASE = dict(
    per_device_train_batch_size=2,
    max_steps=2,
    use_cpu=True,
    bf16=False,
    report_to="none",
    logging_steps=1,
    save_strategy="no",
    gradient_checkpointing=False,
    learning_rate=1e-2,
    disable_tqdm=True,
    seed=0,
)


def sft_trainer(tmp_path, ds=None, *, model=None, eval_dataset=None, **kw) -> EchoSFTTrainer:
    args = EchoSFTConfig(output_dir=str(tmp_path), **{**BASE, **kw})
    return EchoSFTTrainer(
        model or tiny_model(),
        args=args,
        train_dataset=dataset(4) if ds is None else ds,
        eval_dataset=eval_dataset,
        processing_class=tiny_tokenizer("qwen3"),
    )


def expected_loss(model, rows, action_weight: float, coeff: float) -> float:
    """sum(w * CE) / sum(w) over the rows, from the model's full logits and the roles of tokenize_with_roles."""
    tok = tiny_tokenizer("qwen3")
    num = den = 0.0
    with torch.no_grad():
        for row in rows:
            t = tokenize_with_roles(tok, row)
            ids = torch.tensor([t.input_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            for pos in range(1, len(t.input_ids)):
                role = int(t.roles[pos])
                w = action_weight if role == Role.ACTION.code else coeff if role == Role.ENV_OUTPUT.code else 0.0
                if w:
                    num += w * -float(logp[pos - 1, t.input_ids[pos]])
                    den += w
    return num / den


@pytest.mark.parametrize(("action_weight", "coeff"), [(1.0, 1.0), (2.0, 0.25), (1.0, 0.0), (0.0, 1.0)])
def test_loss_equals_an_independent_per_token_computation(tmp_path, action_weight, coeff):
    trainer = sft_trainer(tmp_path, action_weight=action_weight, world_model_coeff=coeff)
    rows = list(trainer.train_dataset)
    inputs = trainer.data_collator(rows)
    trainer.model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, inputs)
    assert loss.item() == pytest.approx(expected_loss(trainer.model, rows, action_weight, coeff), rel=1e-5)
    # with the window's weight sum as divisor (training), the same value when the window is this one batch
    with torch.no_grad():
        window = trainer.compute_loss(trainer.model, inputs, num_items_in_batch=inputs["echo_sft_weights"].sum())
    assert window.item() == pytest.approx(loss.item(), rel=1e-6)


def test_without_world_term_training_equals_trls_sft_on_the_action_tokens(tmp_path):
    """world_model_coeff=0: the same losses and weights as TRL's SFTTrainer given the action tokens as its
    completion mask (pre-tokenized rows, completion_only_loss), from the same initial model and seed."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = tiny_tokenizer("qwen3")
    rows = list(dataset(4))
    tokens = [tokenize_with_roles(tok, r) for r in rows]
    trl_rows = Dataset.from_dict(
        {
            "input_ids": [t.input_ids for t in tokens],
            "completion_mask": [(t.roles == Role.ACTION.code).astype(int).tolist() for t in tokens],
        }
    )
    run = {**BASE, "max_steps": 3, "optim": "sgd", "learning_rate": 0.5}  # SGD: the updates are the gradients
    ours = EchoSFTTrainer(
        tiny_model(),
        args=EchoSFTConfig(output_dir=str(tmp_path / "echo"), world_model_coeff=0.0, **run),
        train_dataset=dataset(4),
        processing_class=tok,
    )
    ours.train()
    theirs = SFTTrainer(
        tiny_model(),
        args=SFTConfig(output_dir=str(tmp_path / "trl"), completion_only_loss=True, max_length=None, **run),
        train_dataset=trl_rows,
        processing_class=tok,
    )
    theirs.train()
    a = [h["loss"] for h in ours.state.log_history if "loss" in h]
    b = [h["loss"] for h in theirs.state.log_history if "loss" in h]
    assert len(a) == 3 and a == pytest.approx(b, rel=1e-5)
    assert len(set(a)) == 3  # it trained
    for (name, p), (_, q) in zip(ours.model.named_parameters(), theirs.model.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("target", ["env_only", "observation"])
def test_masks_equal_the_grpo_sides_for_the_same_rows(tmp_path, target):
    grpo = make_trainer(tmp_path / "grpo", world_loss_target=target, behavior_policy="current")
    g = grpo_batch(grpo)
    sft = sft_trainer(tmp_path / "sft", world_loss_target=target, action_weight=1.0, world_model_coeff=0.5)
    s = sft.data_collator(list(grpo.train_dataset))
    for i in range(len(grpo.train_dataset)):
        p, c = int(g["prompt_mask"][i].sum()), int(g["completion_mask"][i].sum())
        ids = torch.cat([g["prompt_ids"][i, -p:], g["completion_ids"][i, :c]])
        assert torch.equal(s["input_ids"][i, : p + c], ids) and int(s["attention_mask"][i].sum()) == p + c
        assert torch.equal(s["echo_sft_action_mask"][i, p : p + c], g["tool_mask"][i, :c].bool())
        assert torch.equal(s["echo_sft_world_mask"][i, p : p + c], g["world_mask"][i, :c].bool())
        w = s["echo_sft_weights"][i]
        assert not w[:p].any() and not w[p + c :].any()
        expected = g["tool_mask"][i, :c].float() * 1.0 + g["world_mask"][i, :c].float() * 0.5
        assert torch.equal(w[p : p + c], expected)
        assert torch.equal(s["labels"][i] != -100, w > 0)


def test_gradient_accumulation_equals_a_larger_batch(tmp_path):
    """Rows of different lengths and weights: 2 micro-batches of 2 accumulate to the gradient of one batch of 4."""
    kw = dict(max_steps=1, world_model_coeff=0.3, optim="sgd", learning_rate=1.0)  # SGD: the update is the gradient
    big = sft_trainer(tmp_path / "big", per_device_train_batch_size=4, **kw)
    big.train()
    acc = sft_trainer(tmp_path / "acc", per_device_train_batch_size=2, gradient_accumulation_steps=2, **kw)
    acc.train()
    assert acc.state.log_history[0]["loss"] == pytest.approx(big.state.log_history[0]["loss"], rel=1e-5)
    changed = 0
    for (name, p), (_, q) in zip(big.model.named_parameters(), acc.model.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
        changed += not torch.equal(p, tiny_model().state_dict()[name])
    assert changed


def test_min_reward_keeps_the_rewarded_rows_or_zeroes_their_action_weights(tmp_path):
    ds = dataset(8)  # rewards 1.0, 0.0, 0.5, 0.1, 1.0, 0.3, 0.7, 0.2
    kept = sft_trainer(tmp_path / "a", ds, min_reward=0.5)
    assert sorted(kept.train_dataset["reward"]) == [0.5, 0.7, 1.0, 1.0]
    assert (kept.reward_filter.kept, kept.reward_filter.dropped) == (4, 4)
    every = sft_trainer(tmp_path / "b", ds, min_reward=0.5, world_all_episodes=True)
    assert len(every.train_dataset) == 8
    b = every.data_collator(list(every.train_dataset))
    for i, reward in enumerate(every.train_dataset["reward"]):
        actions = b["echo_sft_weights"][i][b["echo_sft_action_mask"][i]]
        world = b["echo_sft_weights"][i][b["echo_sft_world_mask"][i]]
        assert actions.numel() and world.numel()
        assert bool((actions == 1.0).all()) == (reward >= 0.5) and bool((actions == 0).all()) == (reward < 0.5)
        assert bool((world == 1.0).all())


def test_lora_trains_only_the_adapter(tmp_path):
    from peft import LoraConfig

    args = EchoSFTConfig(output_dir=str(tmp_path), **BASE)
    trainer = EchoSFTTrainer(
        tiny_model(),
        args=args,
        train_dataset=dataset(4),
        processing_class=tiny_tokenizer("qwen3"),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    before = {k: v.clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all("lora_" in k for k in moved)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (dict(packing=True), "packing"),
        (dict(world_model_coeff=0.0, action_weight=0.0), "nothing to train"),
        (dict(world_all_episodes=True), "needs min_reward"),
        (dict(assistant_only_loss=True), "assistant_only_loss"),
    ],
)
def test_settings_that_cannot_be_exact_are_refused_in_one_line(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message) as err:
        EchoSFTConfig(output_dir=str(tmp_path), **{**BASE, **flags})
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------
# Resume: kill right after a checkpoint (SIGKILL in a forked process), resume, compare with an uninterrupted run

MAX_STEPS, KILL_AT = 5, 2


def _train(mode: str, init: str, out: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    trained = []

    class Kill(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if mode == "kill" and state.global_step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)

        def on_step_end(self, args, state, control, **kwargs):
            trained.append(state.global_step)

    os.environ["ECHO_TRL_CACHE"] = str(Path(out) / "cache")
    args = EchoSFTConfig(
        output_dir=out,
        **{**BASE, "max_steps": MAX_STEPS, "save_strategy": "steps", "save_steps": KILL_AT},
        gradient_accumulation_steps=2,
        world_model_coeff=0.5,
    )
    trainer = EchoSFTTrainer(
        AutoModelForCausalLM.from_pretrained(init),
        args=args,
        train_dataset=dataset(6),
        processing_class=AutoTokenizer.from_pretrained(init),
        callbacks=[Kill()],
    )
    trainer.train(resume_from_checkpoint=f"{out}/checkpoint-{KILL_AT}" if mode == "resume" else None)
    Path(out, f"{mode}.json").write_text(json.dumps({"log": trainer.state.log_history, "trained": trained}))
    torch.save(trainer.model.state_dict(), Path(out, f"{mode}.pt"))


def _drive(init: str, root: str) -> None:
    codes = {}
    for mode, out in (("full", f"{root}/full"), ("kill", f"{root}/kill"), ("resume", f"{root}/kill")):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _train(mode, init, out)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        codes[mode] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    Path(root, "codes.json").write_text(json.dumps(codes))


def test_resume_after_a_kill_equals_the_uninterrupted_run(tmp_path):
    init = tmp_path / "init"
    tiny_model().save_pretrained(init)
    tiny_tokenizer("qwen3").save_pretrained(init)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(init), str(tmp_path)], env=env, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = json.loads((tmp_path / "codes.json").read_text())
    assert codes == {"full": 0, "kill": -signal.SIGKILL, "resume": 0}, proc.stderr[-3000:]
    full, resumed = (
        json.loads((tmp_path / d / f"{m}.json").read_text()) for d, m in (("full", "full"), ("kill", "resume"))
    )
    assert full["trained"] == list(range(1, MAX_STEPS + 1))
    assert resumed["trained"] == list(range(KILL_AT + 1, MAX_STEPS + 1))  # really resumed, not retrained from 0
    losses = [{h["step"]: h["loss"] for h in r["log"] if "loss" in h} for r in (full, resumed)]
    assert sorted(losses[0]) == list(range(1, MAX_STEPS + 1)) and losses[0] == losses[1]  # bit for bit
    assert len(set(losses[0].values())) == MAX_STEPS
    a, b = torch.load(tmp_path / "full" / "full.pt"), torch.load(tmp_path / "kill" / "resume.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


if __name__ == "__main__":  # the driver of the resume test (a fresh interpreter, forked per run)
    import warnings

    warnings.filterwarnings("ignore")
    _drive(sys.argv[1], sys.argv[2])
