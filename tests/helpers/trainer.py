"""An EchoGRPOTrainer on a tiny model and a small offline dataset, and references to check it against."""

from __future__ import annotations

import torch

from echo_trl.config import EchoGRPOConfig
from echo_trl.data.build import trajectories_to_dataset
from echo_trl.roles import Trajectory, tool_call
from echo_trl.trainer import EchoGRPOTrainer
from helpers.tiny import tiny_model, tiny_tokenizer


def trajectory(
    i: int,
    reward: float,
    group: str,
    *,
    error: bool = False,
    warning: bool = False,
    empty_outputs: bool = False,
    behavior=None,
) -> Trajectory:
    outs = [f'{{"items": [{i}, {i + 1}], "total": {2 * i}}}', "Error: out of stock" if error else f"added {i}"]
    if empty_outputs:
        outs = ["", ""]
    completion = []
    for k, out in enumerate(outs):
        name = ("search", "add")[k]
        completion.append({"role": "assistant", "content": "", "tool_calls": [tool_call(name, {"id": i + k})]})
        completion.append({"role": "tool", "name": name, "content": out})
    warnings = [[] for _ in completion]
    if warning:
        warnings[1] = ["harness: rate limited"]
    return Trajectory(
        prompt=[{"role": "system", "content": "Shop agent."}, {"role": "user", "content": f"Buy item {i}."}],
        completion=completion,
        warnings=warnings,
        reward=reward,
        group_id=group,
        scenario=f"shop{i % 2}",
        task_idx=i,
        tools=[
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": "",
                    "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
                },
            }
            for n in ("search", "add")
        ],
        behavior_logprobs=behavior,
    )


def dataset(n: int = 4, **kw):
    rewards = [1.0, 0.0, 0.5, 0.1, 1.0, 0.3, 0.7, 0.2]
    return trajectories_to_dataset(
        [trajectory(i, rewards[i % 8], f"g{i // 2}", warning=(i == 1), **kw) for i in range(n)]
    )


#: The settings every tiny CPU run shares: one process, float32, nothing logged or saved but the logs.
TINY = dict(
    per_device_train_batch_size=2,
    num_generations=2,
    max_steps=1,
    use_cpu=True,
    bf16=False,
    report_to="none",
    logging_steps=1,
    save_strategy="no",
    max_completion_length=1024,
    gradient_checkpointing=False,
    disable_tqdm=True,
)


def tiny_config(output_dir, **overrides) -> EchoGRPOConfig:
    """An ``EchoGRPOConfig`` for a tiny run on CPU (:data:`TINY`), with ``overrides`` on top; the one place the
    shared block is written."""
    return EchoGRPOConfig(output_dir=str(output_dir), **{**TINY, **overrides})


def make_trainer(tmp_path, ds=None, *, model=None, eval_dataset=None, **kw):
    settings = dict(per_device_train_batch_size=4, learning_rate=1e-2, per_device_eval_batch_size=2)
    trainer = EchoGRPOTrainer(
        model or tiny_model(),
        args=tiny_config(tmp_path, **{**settings, **kw}),
        train_dataset=dataset() if ds is None else ds,
        eval_dataset=eval_dataset,
        processing_class=tiny_tokenizer("qwen3"),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    return trainer


def batch(trainer, ds=None):
    rows = list(trainer.train_dataset if ds is None else ds)
    return trainer._generate_and_score_completions(rows)


def reference_logps(model, inputs, temperature: float = 1.0):
    """Completion-token log-probs from full logits of the model's original forward (no TRL kernel)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = model(input_ids=ids, attention_mask=attn).logits  # fused_lm_head=False: the model's own head
    k = inputs["completion_ids"].size(1)
    logp = torch.log_softmax(logits[:, -k - 1 : -1].float() / temperature, dim=-1)
    return logp.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def count_forwards(model):
    calls = []
    handle = model.model.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    return calls, handle


def prompt_dataset(n=2):
    """Prompts only, for online runs (a rollout_func or TRL's tool loop makes the completions)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": "Weather in Paris?"}]] * n})


def fixed_rollout(tok):
    """A rollout_func giving every prompt the same scripted completion, with its own env and warning masks."""

    def rollout(prompts, trainer):
        p = tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        c = tok("call<|im_end|>result text warn", add_special_tokens=False)["input_ids"]
        n = len(c)
        return {
            "prompt_ids": [p] * len(prompts),
            "completion_ids": [c] * len(prompts),
            "logprobs": None,
            "env_mask": [[1] * 3 + [0] * (n - 3)] * len(prompts),
            "env_output_mask": [[0] * 3 + [1] * (n - 4) + [0]] * len(prompts),
            "warning_mask": [[0] * (n - 1) + [1]] * len(prompts),
        }

    return rollout


def assert_same_gradient(got: torch.Tensor, want: torch.Tensor, name: str = "") -> None:
    """Equal up to float32 summation order: a sum in another order (other processes, other micro-batches)
    rounds within a few ulps of the tensor's largest entry, while a wrong gradient misses by its own size."""
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-4, atol=1e-5 * scale, msg=name)
