"""A real OpenAI-compatible server on loopback: ``transformers serve`` with a tiny local model that calls a tool.

The model (:func:`tool_calling_model`) is built here in a blink: a Qwen2 architecture with TRL's qwen2_5 chat
template whose weights make its turns library_1 tool calls or a short answer. ``transformers serve`` parses
the tool calls itself (its Qwen2 response template), so the chat-template path reads real ``tool_calls`` from
real responses, and the awm-agent path real ``<tool_call>`` text.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from helpers.processes import free_port

#: The model's three kinds of turn, each a few tokens of its tokenizer (one added token holds a call's JSON).
CHAT_CALL = '\n{"name": "search_members", "arguments": {"query": "Priya Raman"}}\n'
AGENT_CALL = (
    '\n{"name": "call_tool", "arguments": {"tool_name": "mcp_tool_search_members", '
    '"arguments": "{\\"query\\": \\"Priya Raman\\"}"}}\n'
)
ANSWER = "Done."


SCENARIOS = Path(__file__).resolve().parents[2] / "data" / "awm_scenarios"


def _library_texts() -> list[str]:
    """library_1's tasks and its tool schemas as the chat template writes them (from a bundled episode)."""
    from echo_trl.data.readers.tools import tool_schemas

    episode = json.loads((SCENARIOS.parent / "episodes" / "library_1_task0.jsonl").read_text().splitlines()[0])
    lines = SCENARIOS.joinpath("gen_tasks.jsonl").read_text().splitlines()
    tasks = [t for line in lines for t in json.loads(line)["tasks"]]
    return [*tasks, *(json.dumps(t, ensure_ascii=False) for t in tool_schemas(episode["tools"]))]


def tool_calling_model(path: Path, *, hidden: int = 64) -> Path:
    """Build (once) and return a tiny model directory whose turns are tool calls or a short answer.

    A random-init Qwen2 whose attention and MLP outputs are zeroed, so each position's logits depend on its
    own token only, with an output layer set to a bigram chain: after the generation prompt ``<tool_call>``
    (about 3 in 4) or ``Done.``; after ``<tool_call>`` the chat-template call of ``search_members`` or (about
    1 in 3) the official AWM agent's ``call_tool`` of it; then ``</tool_call>``, then ``<|im_end|>``. Sampled
    at temperature 1, episodes get varied lengths, valid calls, format errors and final answers in both
    formats; the turn texts are exactly what the qwen2_5 template renders for those calls. ``hidden``: 256 gives
    vLLM a head size its kernels take (64).
    """
    marker = path / "echo_trl_tool_model.json"
    if marker.exists():
        return path
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from echo_trl.demo.tiny import build_tiny_tokenizer

    # trained on library_1's tool schemas and tasks, so its prompts (34 tool schemas) stay a few thousand tokens
    corpus = _library_texts()
    tokenizer = build_tiny_tokenizer("qwen2_5", [*corpus, "Priya Raman search members", ANSWER], vocab_size=4096)
    tokenizer.add_tokens([CHAT_CALL, AGENT_CALL, ANSWER])
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    tid = tokenizer.convert_tokens_to_ids
    gen_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True)
    gen_prompt = gen_prompt["input_ids"] if hasattr(gen_prompt, "keys") else gen_prompt
    start, open_, close, end = gen_prompt[-1], tid("<tool_call>"), tid("</tool_call>"), tid("<|im_end|>")
    chat, agent, answer = tid(CHAT_CALL), tid(AGENT_CALL), tid(ANSWER)
    chain = {start: {open_: 14.0, answer: 12.9}, open_: {chat: 14.0, agent: 13.3}, chat: {close: 30.0}}
    chain |= {agent: {close: 30.0}, close: {end: 30.0}, answer: {end: 30.0}}
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        emb[:, : len(chain)] = 0.0  # the chain's tokens own the first coordinates, one each
        head = model.lm_head.weight
        head.zero_()
        for i, (src, successors) in enumerate(chain.items()):
            emb[src] = 0.0
            emb[src, i] = 1.0
            for dst, logit in successors.items():
                head[dst, i] = logit / hidden**0.5  # RMSNorm scales a one-hot vector by sqrt(hidden)
    model.generation_config.do_sample = True
    model.generation_config.top_k = None
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    model.save_pretrained(tmp)
    (tmp / marker.name).write_text(json.dumps({"chain": {str(k): v for k, v in chain.items()}}))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


class TransformersServer:
    """``transformers serve [MODEL]`` on 127.0.0.1 (a free port), started and stopped by tests; without a model it
    loads whichever path a request names (and answers 500 while that path holds no model)."""

    def __init__(self, model: Path | None, log: Path, port: int | None = None):
        self.model, self.log, self.port = model, log, port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 180.0) -> TransformersServer:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
        cli = Path(sys.executable).with_name("transformers")
        cmd = [str(cli) if cli.exists() else "transformers", "serve", *([str(self.model)] if self.model else [])]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu", "--log-level", "warning"]
        with open(self.log, "a") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-2000:]
                raise RuntimeError(f"transformers serve exited ({self.proc.returncode}): {tail}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"transformers serve did not answer /health in {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
