"""Online prefix sharing: TRL's generated batch (left-padded prompts, right-padded completions with tool spans)
forwarded as a prefix tree gives the unshared forward's loss, gradients, old / reference log-probs and importance
ratios (TRL's tool loop; a ``rollout_func`` with LoRA, gradient accumulation and ``num_iterations > 1``), and the
token-use metrics say what the forward ran (``batch/packing_ratio``, ``batch/masked_token_frac``)."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from helpers.tiny import tiny_model, tiny_tokenizer
from helpers.trainer import assert_same_gradient, tiny_config

from echo_trl.config import EchoGRPOConfig
from echo_trl.train import trl_compat
from echo_trl.train.batch import CompletionMasks, forward_inputs
from echo_trl.trainer import EchoGRPOTrainer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

ATOL = 1e-5
SYSTEM = "You are a weather agent. " + " ".join(f"Rule {i}: answer with the tool's numbers." for i in range(12))
CITIES = ["Paris", "Oslo", "Lima", "Rome", "Kyiv", "Baku", "Doha", "Riga"]


def lookup(city: str) -> str:
    """Weather of a city.

    Args:
        city: the city name.
    """
    return f"Sunny in {city}, {len(city) * 3} C, wind {len(city)} km/h"


def prompts(n: int) -> Dataset:
    """``n`` prompts sharing a long system prompt (a preamble), each its own question."""
    return Dataset.from_dict(
        {
            "prompt": [
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Weather {i}?"}] for i in range(n)
            ]
        }
    )


def config(tmp_path, share: bool, **kw) -> EchoGRPOConfig:
    """The shared tiny run (helpers' ``tiny_config``) with sharing on or off, everything else equal."""
    settings = dict(
        per_device_train_batch_size=4,
        max_completion_length=96,
        world_model_coeff=0.5,
        prefix_sharing=share,
        prefix_sharing_min_tokens=8,
        learning_rate=1e-2,
        optim="sgd",  # weights move linearly in the gradient (Adam turns rounding into lr-sized steps)
        seed=7,
    )
    return tiny_config(tmp_path / f"share{int(share)}", **{**settings, **kw})


def reward(completions, **kw):
    return [float(sum(map(ord, str(c))) % 7) for c in completions]


def tool_loop_trainer(tmp_path, share: bool, model_path, **kw) -> EchoGRPOTrainer:
    """TRL's own tool loop on a scripted model: row i calls ``lookup`` for its own city, then answers."""
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer("qwen3")
    trainer = EchoGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(model_path),
        reward_funcs=[reward],
        args=config(tmp_path, share, **kw),
        train_dataset=prompts(2),
        processing_class=tok,
        tools=[lookup],
    )
    turn = {"n": 0}

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        turn["n"] += 1
        if turn["n"] == 1:  # the first turn of every row: a call of its own (the rows diverge inside the call)
            texts = [
                f'<tool_call>\n{{"name": "lookup", "arguments": {{"city": "{CITIES[i]}"}}}}\n</tool_call><|im_end|>'
                for i in range(len(prompt_ids))
            ]
        else:
            texts = [f"It is sunny ({i}).<|im_end|>" for i in range(len(prompt_ids))]
        return [tok(t, add_special_tokens=False)["input_ids"] for t in texts], None

    trainer._generate_single_turn = scripted
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny"
    tiny_model().save_pretrained(path)  # beta > 0: TRL loads the reference model from this path
    return path


def test_tool_loop_batch_gives_the_unshared_loss_gradients_and_ratios(tmp_path, model_path):
    out = {}
    for share in (False, True):
        trainer = tool_loop_trainer(tmp_path, share, model_path, beta=0.04, num_iterations=2)
        inputs = trainer._generate_and_score_completions(list(trainer.train_dataset.select(range(2))) * 2)
        mask = inputs["prompt_mask"]
        assert (mask[:, 0] == 0).any() or mask.all()  # TRL's layout: prompts left-padded
        assert (inputs["tool_mask"] == 0).any() and "old_per_token_logps" in inputs and "ref_per_token_logps" in inputs
        with torch.no_grad():  # a policy away from the reference and the old policy: KL and ratios != 1
            for p in trainer.model.parameters():
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        loss = trainer._compute_loss(trainer.model, inputs)
        loss.backward()
        m = trl_compat.metrics(trainer, "train")
        forward = trl_compat.policy_logps(trainer, trainer.model, *forward_inputs(inputs))
        completion = inputs["completion_mask"].bool()
        out[share] = {
            "inputs": inputs,
            "loss": loss.item(),
            "kl": m["kl"][-1],
            "ratio": torch.exp(forward - inputs["old_per_token_logps"])[completion],
            "old": inputs["old_per_token_logps"][completion],
            "ref": inputs["ref_per_token_logps"][completion],
            "grads": {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None},
            "packing": m["batch/packing_ratio"][-1],
            "masked": m["batch/masked_token_frac"][-1],
        }
    a, b = out[False], out[True]
    assert torch.equal(a["inputs"]["completion_ids"], b["inputs"]["completion_ids"])  # the same generated batch
    assert b["loss"] == pytest.approx(a["loss"], abs=ATOL) and b["kl"] == pytest.approx(a["kl"], abs=ATOL)
    assert b["kl"] > 0
    for key in ("ratio", "old", "ref"):
        torch.testing.assert_close(b[key], a[key], atol=ATOL, rtol=ATOL, msg=key)
    assert (a["ratio"] - 1).abs().max() > 1e-3  # the importance ratios really moved
    assert a["grads"].keys() == b["grads"].keys() and a["grads"]
    for n in a["grads"]:
        torch.testing.assert_close(b["grads"][n], a["grads"][n], atol=ATOL, rtol=1e-4, msg=n)
    # token use: unshared, every padded column is run; shared, the preamble and each group's prompt once
    inputs = a["inputs"]
    ids, attention, _ = forward_inputs(inputs)
    own = int(attention.sum())
    assert a["packing"] == (own, ids.numel())
    unique = len(
        {
            tuple(row[m.bool()][: k + 1].tolist())
            for row, m in zip(ids, attention, strict=True)
            for k in range(int(m.sum()))
        }
    )
    assert b["packing"][0] == own and unique <= b["packing"][1] <= unique + len(ids)
    masks = CompletionMasks.of(inputs)
    trained = int((masks.action | masks.world).sum())
    assert a["masked"] == b["masked"] == (own - trained, own)
    assert 0 < trained < own


def _rollout(tok):
    """A rollout_func whose completion depends on the prompt and on the generation (rows of a group diverge)."""

    def rollout(prompts, trainer):
        out = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "logprobs": None}
        seen: dict[str, int] = {}
        for p in prompts:  # the k-th generation of a prompt: the same in every process layout
            i = seen[str(p)] = seen.get(str(p), -1) + 1
            i += int(p[-1]["content"].split()[-1][:-1])
            p_ids = tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
            call = tok(f"call {CITIES[i % len(CITIES)]}<|im_end|>", add_special_tokens=False)["input_ids"]
            result = tok(f" result {i % 3} wind {len(p_ids) % 7}", add_special_tokens=False)["input_ids"]
            end = tok(" done<|im_end|>", add_special_tokens=False)["input_ids"]
            out["prompt_ids"].append(p_ids)
            out["completion_ids"].append(call + result + end)
            out["env_mask"].append([1] * len(call) + [0] * len(result) + [1] * len(end))
        return out

    return rollout


def _run(tmp_path, share: bool, peft=None, **kw) -> EchoGRPOTrainer:
    tok = tiny_tokenizer("qwen3")
    trainer = EchoGRPOTrainer(
        tiny_model(),
        reward_funcs=[reward],
        args=config(tmp_path, share, **kw),
        train_dataset=prompts(8),
        processing_class=tok,
        rollout_func=_rollout(tok),
        peft_config=peft,
    )
    trainer.train()
    return trainer


@pytest.mark.parametrize("case", ["accumulation", "lora"])
def test_rollout_func_runs_shared_and_unshared_are_the_same(tmp_path, case):
    """Whole optimizer steps. With gradient accumulation the shared run shuffles whole groups where TRL shuffles
    rows (other micro-batches of the same generation batch, which one optimizer step takes whole): DAPO's loss and
    the world term divide by global counts, so the step's loss and gradient are the same; per-micro-batch metrics
    (means of per-micro-batch values) are not compared then."""
    kw, peft = {}, None
    if case == "accumulation":
        kw = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, num_iterations=2, max_steps=2)
    else:
        from peft import LoraConfig

        peft = LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, task_type="CAUSAL_LM"
        )
        kw = dict(learning_rate=5e-2, num_iterations=2, max_steps=2)
    runs = {share: _run(tmp_path, share, peft, **kw) for share in (False, True)}
    keys = ("loss",) if case == "accumulation" else ("loss", "world/ce_env", "entropy", "kl", "clip_ratio/region_mean")
    logs = {s: [h for h in runs[s].state.log_history if "loss" in h] for s in runs}
    assert len(logs[True]) == len(logs[False]) == runs[True].args.max_steps
    for x, y in zip(logs[False], logs[True], strict=True):
        for k in keys:
            if k in x:
                assert y[k] == pytest.approx(x[k], abs=ATOL, rel=ATOL), k
        assert y["batch/packing_ratio"] > 1 >= x["batch/packing_ratio"]
        assert y["batch/masked_token_frac"] == pytest.approx(x["batch/masked_token_frac"])
    pa, pb = dict(runs[False].model.named_parameters()), dict(runs[True].model.named_parameters())
    moved = 0
    for name, p in pa.items():
        torch.testing.assert_close(pb[name], p, atol=ATOL, rtol=ATOL, msg=name)
        moved += p.requires_grad
    assert moved


def test_online_sharing_shuffles_whole_groups(tmp_path):
    """Online with sharing, TRL's generation batch is cut into micro-batches with each group's rows together."""
    tok = tiny_tokenizer("qwen3")
    trainer = EchoGRPOTrainer(
        tiny_model(),
        reward_funcs=[reward],
        args=config(tmp_path, True, per_device_train_batch_size=2, gradient_accumulation_steps=4),
        train_dataset=prompts(8),
        processing_class=tok,
        rollout_func=_rollout(tok),
    )
    assert trainer.args.steps_per_generation == 4
    trainer.model.train()
    trainer._step, trainer._buffered_inputs = 0, None
    rows = list(trainer.train_dataset.select([0, 0, 1, 1, 2, 2, 3, 3]))
    torch.manual_seed(0)
    micro = [trainer._prepare_inputs(rows)]
    for step in range(1, 4):
        trainer._step = step
        micro.append(trainer._prepare_inputs(rows))
    keys = [[ids[m.bool()].tolist() for ids, m in zip(b["prompt_ids"], b["prompt_mask"], strict=True)] for b in micro]
    assert all(k[0] == k[1] for k in keys)  # each micro-batch is one group
    assert len({str(k[0]) for k in keys}) == 4


_DDP_SCRIPT = """
import os, sys, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, {tests!r})
sys.path.insert(0, {here!r})
from test_sharing import run_grabbing_gradients
run_grabbing_gradients(2, sys.argv[1], share=True)
from echo_trl.commands.support.launch_checks import leave_process_group
leave_process_group()
"""


def run_grabbing_gradients(per_device: int, out: str, *, share: bool) -> None:
    """One optimizer step over 2 groups (rank 0 saves the all-reduced gradient to ``out``)."""
    import os
    from pathlib import Path

    from transformers import TrainerCallback

    class Grab(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            if int(os.environ.get("RANK", "0")) == 0:
                torch.save({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, out)

    tok = tiny_tokenizer("qwen3")
    args = config(Path(out).parent, share, per_device_train_batch_size=per_device, max_grad_norm=0.0)
    EchoGRPOTrainer(
        tiny_model(),
        reward_funcs=[reward],
        args=args,
        train_dataset=prompts(4),
        processing_class=tok,
        rollout_func=_rollout(tok),
        callbacks=[Grab()],
    ).train()


@pytest.mark.slow
def test_two_sharing_processes_give_the_single_unshared_process_gradient(tmp_path):
    """Real data parallelism online (torchrun, 2 CPU processes, gloo, a rollout_func): each process shares its
    group's prompt; the all-reduced gradient equals one unshared process's over both groups (in this process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from helpers.processes import free_port

    run_grabbing_gradients(4, str(tmp_path / "single.pt"), share=False)
    script = tmp_path / "ddp_online.py"
    here = Path(__file__).parent
    script.write_text(_DDP_SCRIPT.format(tests=str(here.parents[1]), here=str(here)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    ]
    run = subprocess.run(
        [*launch, str(script), str(tmp_path / "ddp.pt")], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr[-3000:]
    a, b = torch.load(tmp_path / "single.pt"), torch.load(tmp_path / "ddp.pt")
    assert a.keys() == b.keys() and a
    for name in a:
        assert_same_gradient(b[name], a[name], name)
