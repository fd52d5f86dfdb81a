"""EchoSFTTrainer against TRL's own SFTTrainer: the same tokens, losses and weights wherever rows have no roles
(per dataset type, dense and MoE), role weights carried through TRL's packing and padding-free collation, the
weighted loss against an independent per-token computation, observation supervision on a tool-use ``messages``
dataset, ECHO trajectory datasets with the GRPO side's masks, PEFT, gradient accumulation and exact resume."""

from __future__ import annotations

import copy
import inspect
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from helpers.sft import sft_dataset, tiny_moe, tool_conversation, tool_messages
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import batch as grpo_batch
from helpers.trainer import dataset, make_trainer
from transformers import TrainingArguments
from trl import SFTConfig, SFTTrainer

from echo_trl.errors import EchoTrlError
from echo_trl.roles import Role, Trajectory
from echo_trl.sft_config import EchoSFTConfig
from echo_trl.sft_trainer import EchoSFTTrainer
from echo_trl.tokens.tokenization import tokenize_with_roles
from echo_trl.train.sft.weights import ACTION, OBSERVATION, PLAIN, class_weights, split_labels

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

BASE = dict(
    per_device_train_batch_size=2,
    max_steps=2,
    use_cpu=True,
    bf16=False,
    report_to="none",
    logging_steps=1,
    save_strategy="no",
    gradient_checkpointing=False,
    learning_rate=0.5,
    optim="sgd",  # SGD: the updates are the gradients
    disable_tqdm=True,
    seed=0,
)


def echo(tmp_path, ds, *, model=None, **kw) -> EchoSFTTrainer:
    return EchoSFTTrainer(
        model or tiny_model(),
        args=EchoSFTConfig(output_dir=str(tmp_path), **{**BASE, **kw}),
        train_dataset=ds,
        processing_class=tiny_tokenizer("qwen3"),
    )


def trl(tmp_path, ds, *, model=None, **kw) -> SFTTrainer:
    return SFTTrainer(
        model or tiny_model(),
        args=SFTConfig(output_dir=str(tmp_path), **{**BASE, **kw}),
        train_dataset=ds,
        processing_class=tiny_tokenizer("qwen3"),
    )


def losses(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def weights_of(labels, table) -> torch.Tensor:
    """Per-token weights of one row's labels (1 on TRL's trained tokens where they carry no class)."""
    labels = torch.as_tensor(labels)
    split = split_labels(labels)
    return (labels != -100).float() if split is None else class_weights(split[1], table)


# --------------------------------------------------------------------------------------------
# Without roles, EchoSFTTrainer is SFTTrainer


@pytest.mark.parametrize(
    "kind", ["text", "messages", "prompt_completion", "conversational_prompt_completion", "pretokenized", "streaming"]
)
def test_without_roles_it_is_trls_sft_bit_for_bit(tmp_path, kind):
    """observation_weight=0 on every dataset type: the same prepared tokens and labels, the same losses and the same
    parameters after 2 SGD steps as TRL's SFTTrainer, bit for bit."""
    ds = sft_dataset("messages" if kind == "streaming" else kind)
    make = (lambda: ds.to_iterable_dataset()) if kind == "streaming" else (lambda: ds)
    ours = echo(tmp_path / "echo", make(), observation_weight=0.0)
    theirs = trl(tmp_path / "trl", make())
    if kind != "streaming":
        assert ours.train_dataset["input_ids"] == theirs.train_dataset["input_ids"]
        assert ours.train_dataset["labels"] == theirs.train_dataset["labels"]
    ours.train()
    theirs.train()
    assert len(losses(ours)) == 2 and losses(ours) == losses(theirs)
    for (name, p), (_, q) in zip(ours.model.named_parameters(), theirs.model.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_moe_without_roles_is_trls_sft_with_its_aux_loss(tmp_path):
    """A tiny Qwen3-MoE: the load-balancing loss is added and logged exactly as TRL does."""
    ds = sft_dataset("messages")
    ours = echo(tmp_path / "echo", ds, model=tiny_moe(), observation_weight=0.0)
    theirs = trl(tmp_path / "trl", ds, model=tiny_moe())
    ours.train()
    theirs.train()
    aux = [h["aux_loss"] for h in ours.state.log_history if "aux_loss" in h]
    assert len(aux) == 2 and aux == [h["aux_loss"] for h in theirs.state.log_history if "aux_loss" in h]
    assert losses(ours) == losses(theirs)
    for (name, p), (_, q) in zip(ours.model.named_parameters(), theirs.model.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_tool_messages_at_unit_weights_train_what_trl_trains(tmp_path):
    """On a tool-use dataset TRL trains every token (no assistant_only_loss): unit weights change nothing, though
    the labels now say which tokens are actions and observations."""
    ours = echo(tmp_path / "echo", tool_messages())
    theirs = trl(tmp_path / "trl", tool_messages())
    for mine, trls in zip(ours.train_dataset["labels"], theirs.train_dataset["labels"], strict=True):
        ids, classes = split_labels(torch.tensor([mine]))
        assert ids[0].tolist() == trls and {ACTION, OBSERVATION} <= set(classes[0].tolist())
    ours.train()
    theirs.train()
    assert losses(ours) == pytest.approx(losses(theirs), rel=1e-6)
    assert all(h["sft/tokens_env"] > 0 for h in ours.state.log_history if "loss" in h)


# --------------------------------------------------------------------------------------------
# Observation supervision


def test_assistant_only_loss_plus_observations_on_a_tool_use_messages_dataset(tmp_path):
    """TRL's assistant_only_loss trains the assistant's turns; EchoSFTTrainer also trains the tool messages'
    content (and nothing else): the tokens it adds decode to exactly the tool outputs."""
    tok = tiny_tokenizer("qwen3")
    ours = echo(tmp_path / "echo", tool_messages(), assistant_only_loss=True, observation_weight=0.5)
    theirs = trl(tmp_path / "trl", tool_messages(), assistant_only_loss=True)
    for i, (mine, trls) in enumerate(zip(ours.train_dataset["labels"], theirs.train_dataset["labels"], strict=True)):
        ids, classes = split_labels(torch.tensor([mine]))
        trl_trained = torch.tensor(trls) != -100
        added = (classes[0] >= 0) & ~trl_trained
        assert torch.equal((classes[0] >= 0) & trl_trained, trl_trained)  # every token TRL trains, still trained
        assert torch.equal(added, classes[0] == OBSERVATION)
        tool_output = next(m["content"] for m in tool_conversation(i) if m["role"] == "tool")
        decoded = tok.decode(ids[0][added])  # a BPE token joining the output's end and the newline after it counts
        assert decoded.startswith(tool_output) and not decoded[len(tool_output) :].strip()
    ours.train()
    assert all(h["sft/tokens_env"] > 0 and "sft/ce_env" in h for h in ours.state.log_history if "loss" in h)


def expected_loss(model, conversations, action_weight: float, observation_weight: float) -> float:
    """sum(w * CE) / sum(w) from the model's full logits in float64; roles from tokenize_with_roles (exact, audited),
    TRL training every token of a messages row."""
    tok = tiny_tokenizer("qwen3")
    num = den = 0.0
    with torch.no_grad():
        for messages in conversations:
            first = next(k for k, m in enumerate(messages) if m["role"] == "assistant")
            t = tokenize_with_roles(tok, Trajectory(messages[:first], messages[first:], tools=json.loads(TOOLS_JSON)))
            logp = torch.log_softmax(model(input_ids=torch.tensor([t.input_ids])).logits[0].double(), dim=-1)
            for pos in range(1, len(t.input_ids)):
                role = int(t.roles[pos])
                w = {Role.ACTION.code: action_weight, Role.ENV_OUTPUT.code: observation_weight}.get(role, 1.0)
                num += w * -float(logp[pos - 1, t.input_ids[pos]])
                den += w
    return num / den


TOOLS_JSON = tool_messages(1)["tools"][0]


@pytest.mark.parametrize(("action_weight", "observation_weight"), [(2.0, 0.25), (1.0, 0.0)])
def test_loss_equals_an_independent_per_token_computation(tmp_path, action_weight, observation_weight):
    trainer = echo(tmp_path, tool_messages(), action_weight=action_weight, observation_weight=observation_weight)
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    inputs = trainer.data_collator([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows])
    trainer.model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, inputs)
    conversations = [tool_conversation(i) for i in range(4)]
    assert loss.item() == pytest.approx(expected_loss(trainer.model, conversations, action_weight, observation_weight))


# --------------------------------------------------------------------------------------------
# Packing, padding-free, gradient accumulation


@pytest.mark.parametrize("mode", ["bfd", "padding_free"])
def test_packed_and_padding_free_give_the_unpacked_loss(tmp_path, mode):
    kw = dict(action_weight=2.0, observation_weight=0.5, max_steps=1, per_device_train_batch_size=4)
    kw["shuffle_dataset"] = False
    flat = echo(tmp_path / "flat", tool_messages(), **kw)
    extra = dict(packing=True, packing_strategy="bfd") if mode == "bfd" else dict(padding_free=True, max_length=None)
    packed = echo(tmp_path / mode, tool_messages(), **kw, **extra)
    if mode == "bfd":
        assert len(packed.train_dataset) < len(flat.train_dataset)  # really packed
    flat.train()
    packed.train()
    assert losses(packed) == pytest.approx(losses(flat), rel=1e-5)
    for (name, p), (_, q) in zip(flat.model.named_parameters(), packed.model.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_wrapped_packing_carries_every_weight(tmp_path):
    kw = dict(action_weight=2.0, observation_weight=0.5, max_length=64)
    flat = echo(tmp_path / "flat", tool_messages(), **{**kw, "max_length": None})
    wrapped = echo(tmp_path / "wrapped", tool_messages(), packing=True, packing_strategy="wrapped", **kw)

    def total(ds):
        return sum(float(weights_of(r, (1.0, 2.0, 0.5)).sum()) for r in ds["labels"])

    assert len(wrapped.train_dataset) > len(flat.train_dataset)  # cut into max_length chunks
    assert total(wrapped.train_dataset) == pytest.approx(total(flat.train_dataset))


def test_gradient_accumulation_equals_a_larger_batch(tmp_path):
    """Rows of different lengths and weights: 2 micro-batches of 2 accumulate to the gradient of one batch of 4."""
    kw = dict(max_steps=1, observation_weight=0.3, action_weight=1.5, shuffle_dataset=False)
    big = echo(tmp_path / "big", tool_messages(), per_device_train_batch_size=4, **kw)
    big.train()
    acc = echo(tmp_path / "acc", tool_messages(), gradient_accumulation_steps=2, **kw)
    acc.train()
    assert acc.state.log_history[0]["loss"] == pytest.approx(big.state.log_history[0]["loss"], rel=1e-5)
    for (name, p), (_, q) in zip(big.model.named_parameters(), acc.model.named_parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


# --------------------------------------------------------------------------------------------
# ECHO trajectory datasets


@pytest.mark.parametrize("target", ["env_only", "observation"])
def test_trajectory_masks_equal_the_grpo_sides_for_the_same_rows(tmp_path, target):
    grpo = make_trainer(tmp_path / "grpo", world_loss_target=target, behavior_policy="current")
    g = grpo_batch(grpo)
    sft = echo(tmp_path / "sft", dataset(4), world_loss_target=target, observation_weight=0.5, max_length=None)
    for i in range(len(grpo.train_dataset)):
        p, c = int(g["prompt_mask"][i].sum()), int(g["completion_mask"][i].sum())
        ids = torch.cat([g["prompt_ids"][i, -p:], g["completion_ids"][i, :c]])
        labels = torch.tensor([sft.train_dataset[i]["labels"]])
        assert sft.train_dataset[i]["input_ids"] == ids.tolist()
        plain_ids, classes = split_labels(labels)
        assert not (classes[0, :p] >= 0).any()  # the prompt: TRL's completion-only mask
        assert torch.equal(classes[0, p:] == ACTION, g["tool_mask"][i, :c].bool())
        assert torch.equal(classes[0, p:] == OBSERVATION, g["world_mask"][i, :c].bool())
        untrained = classes[0, p:] < 0
        assert torch.equal(untrained, g["warning_mask"][i, :c].bool() & ~g["world_mask"][i, :c].bool())
        assert torch.equal(plain_ids[0][classes[0] >= 0], ids[classes[0] >= 0])


def test_min_reward_keeps_the_rewarded_rows_or_trains_only_their_observations(tmp_path):
    ds = dataset(8)  # rewards 1.0, 0.0, 0.5, 0.1, 1.0, 0.3, 0.7, 0.2
    kept = echo(tmp_path / "a", ds, min_reward=0.5, max_length=None)
    assert sorted(kept.train_dataset["reward"]) == [0.5, 0.7, 1.0, 1.0]
    assert (kept.reward_filter.kept, kept.reward_filter.dropped) == (4, 4)
    every = echo(tmp_path / "b", ds, min_reward=0.5, world_all_episodes=True, max_length=None)
    assert len(every.train_dataset) == 8
    for reward, labels in zip(every.train_dataset["reward"], every.train_dataset["labels"], strict=True):
        classes = set(split_labels(torch.tensor([labels]))[1][0].tolist()) - {-1}
        assert classes == ({PLAIN, ACTION, OBSERVATION} if reward >= 0.5 else {OBSERVATION})


def test_rows_whose_trainable_tokens_all_fall_past_max_length_are_refused_in_one_line(tmp_path):
    """TRL drops a row with no label left after its truncation; a dataset it empties is named, not a sampler error."""
    with pytest.raises(EchoTrlError, match=r"^train_dataset: no row is left after TRL's preparation .*max_length=4"):
        echo(tmp_path / "cut", dataset(4), max_length=4)
    assert len(echo(tmp_path / "whole", dataset(4), max_length=None).train_dataset) == 4  # the same rows, uncut


# --------------------------------------------------------------------------------------------
# Drop-in: signature, arguments, PEFT, templates


def test_the_signature_is_sfttrainers():
    ours = list(inspect.signature(EchoSFTTrainer.__init__).parameters)
    assert ours == list(inspect.signature(SFTTrainer.__init__).parameters)


@pytest.mark.parametrize("args_class", [SFTConfig, TrainingArguments])
def test_trl_and_transformers_arguments_are_converted(tmp_path, args_class):
    args = args_class(output_dir=str(tmp_path), learning_rate=0.123, use_cpu=True, report_to="none")
    trainer = EchoSFTTrainer(tiny_model(), args, None, sft_dataset("text"), processing_class=tiny_tokenizer("qwen3"))
    assert isinstance(trainer.args, EchoSFTConfig) and trainer.args.learning_rate == 0.123
    assert trainer.args.observation_weight == 1.0


def test_world_model_coeff_is_a_deprecated_name_of_observation_weight(tmp_path):
    with pytest.warns(FutureWarning, match="observation_weight"):
        args = EchoSFTConfig(output_dir=str(tmp_path), world_model_coeff=0.25, use_cpu=True)
    assert (args.observation_weight, args.world_model_coeff) == (0.25, None)
    with warnings.catch_warnings(), pytest.raises(ValueError, match="one setting under two names"):
        warnings.simplefilter("ignore")
        EchoSFTConfig(output_dir=str(tmp_path), world_model_coeff=0.25, observation_weight=0.5, use_cpu=True)


@pytest.mark.parametrize("peft", ["lora", "prompt_tuning"])
def test_peft_trains_with_role_weights(tmp_path, peft):
    """LoRA trains only the adapter; prompt tuning's virtual tokens come before the weighted ones."""
    from peft import LoraConfig, PromptTuningConfig, TaskType

    config = (
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        if peft == "lora"
        else PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=4)
    )
    trainer = EchoSFTTrainer(
        tiny_model(),
        args=EchoSFTConfig(output_dir=str(tmp_path), **{**BASE, "max_steps": 1}, observation_weight=0.5),
        train_dataset=tool_messages(),
        processing_class=tiny_tokenizer("qwen3"),
        peft_config=config,
    )
    before = {k: v.clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(("lora_" if peft == "lora" else "prompt_encoder") in k for k in moved)
    assert trainer.state.log_history[0]["sft/tokens_env"] > 0


NO_TOOLS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_without_tool_calls_is_refused_only_for_rows_with_them(tmp_path):
    tok = copy.copy(tiny_tokenizer("qwen3"))
    tok.chat_template = NO_TOOLS_TEMPLATE
    plain = sft_dataset("messages")
    with_tools = Dataset.from_dict({"messages": [*plain["messages"], tool_conversation(0)]})
    args = EchoSFTConfig(output_dir=str(tmp_path), **BASE)
    EchoSFTTrainer(tiny_model(), args=args, train_dataset=plain, processing_class=tok)  # no tool call: trains
    with pytest.raises(EchoTrlError, match=r"train row 4: .*tool_calls") as err:
        EchoSFTTrainer(tiny_model(), args=args, train_dataset=with_tools, processing_class=tok)
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
        observation_weight=0.5,
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
