"""Small SFT datasets of every type TRL's SFTTrainer takes, a Hub-shaped tool-use ``messages`` dataset, and a tiny
random-init Qwen3-MoE model (tests of EchoSFTTrainer against SFTTrainer)."""

from __future__ import annotations

import json

from datasets import Dataset

from helpers.tiny import tiny_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')}.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
    for name in ("search_products", "get_weather")
]

_QA = [("What is better than ugly?", "Beautiful."), ("What is better than implicit?", "Explicit."),
       ("What is better than complex?", "Simple."), ("What counts?", "Readability.")]  # fmt: skip


def tool_conversation(i: int) -> list[dict]:
    """A user task, an assistant tool call, the tool's output, and the assistant's answer."""
    name = TOOLS[i % 2]["function"]["name"]
    return [
        {"role": "system", "content": "You are a shop agent."},
        {"role": "user", "content": f"Find item {i} for me."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": {"query": f"item {i}"}}}],
        },
        {"role": "tool", "name": name, "content": f'{{"items": [{i}, {i + 1}], "total": {2 * i + 1}}}' * (1 + i % 3)},
        {"role": "assistant", "content": f"Item {i} costs {3 * i + 2} dollars."},
    ]


def tool_messages(n: int = 4) -> Dataset:
    """A Hub-shaped tool-use dataset: ``messages`` with tool calls and tool messages, ``tools`` as JSON text."""
    return Dataset.from_dict({"messages": [tool_conversation(i) for i in range(n)], "tools": [json.dumps(TOOLS)] * n})


def sft_dataset(kind: str, n: int = 4) -> Dataset:
    """A dataset of one of TRL's SFT types: ``text``, ``messages``, ``prompt_completion`` (standard),
    ``conversational_prompt_completion``, ``pretokenized``."""
    qa = [_QA[i % len(_QA)] for i in range(n)]
    if kind == "text":
        return Dataset.from_dict({"text": [f"{q} {a}" for q, a in qa]})
    if kind == "messages":
        return Dataset.from_dict(
            {"messages": [[{"role": "user", "content": q}, {"role": "assistant", "content": a}] for q, a in qa]}
        )
    if kind == "prompt_completion":
        return Dataset.from_dict({"prompt": [q for q, _ in qa], "completion": [f" {a}" for _, a in qa]})
    if kind == "conversational_prompt_completion":
        return Dataset.from_dict(
            {
                "prompt": [[{"role": "user", "content": q}] for q, _ in qa],
                "completion": [[{"role": "assistant", "content": a}] for _, a in qa],
            }
        )
    if kind == "pretokenized":
        tok = tiny_tokenizer("qwen3")
        return Dataset.from_dict({"input_ids": [tok(f"{q} {a}")["input_ids"] for q, a in qa]})
    raise ValueError(kind)


def tiny_moe(seed: int = 0):
    """A random-init Qwen3-MoE causal LM (4 experts, 2 per token) sized to the tiny Qwen3 tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = tiny_tokenizer("qwen3")
    config = AutoConfig.for_model(
        "qwen3_moe",
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=4096,
        router_aux_loss_coef=0.01,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)
