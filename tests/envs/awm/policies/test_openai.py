"""The sampler's log-probs: vLLM's response schema parsed, turns aligned with the trainer's tokens, trained on.

Responses in vLLM's documented schema come from two places: hand-written fixtures (tests/fixtures/vllm_responses,
with their source) for the parser, and, for the end-to-end path, :class:`VLLMAnswers`, which answers each request
as vLLM does (same JSON fields) from a real tiny model sampled here, because vLLM itself needs a GPU
(``benchmarks/gpu/vllm_logprobs.py`` runs the same path against ``vllm serve`` where one is lent).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from helpers.inference_server import tool_calling_model
from helpers.trainer import batch, reference_logps, tiny_config

from echo_trl.clients.openai import backoff_seconds
from echo_trl.data.readers.records import token_ids_hash
from echo_trl.envs.awm.capture.jobs import Job, pooled_runner, run_jobs
from echo_trl.envs.awm.capture.summary import summarize
from echo_trl.envs.awm.policies.openai import OpenAIPolicy
from echo_trl.envs.awm.policies.policy import PolicyError
from echo_trl.envs.awm.policies.sampled import sampled_turn
from echo_trl.envs.awm.runtime.pool import ServerPool
from echo_trl.envs.awm.scenario.source import ScenarioSource
from echo_trl.tokens.sampled import align_record, apply_alignment

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "vllm_responses"
LIBRARY = Path(__file__).resolve().parents[4] / "data" / "awm_scenarios"

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


# -- parsing --------------------------------------------------------------------------------------


def test_vllm_token_ids_logprobs_and_prompt_ids_are_read():
    data = fixture("tool_call_token_ids.json")
    turn = sampled_turn(data)
    entries = data["choices"][0]["logprobs"]["content"]
    assert turn.token_ids == data["choices"][0]["token_ids"]
    assert turn.logprobs == [e["logprob"] for e in entries]
    assert turn.tool_calls == [{"name": "search_members", "arguments": '{"query": "Priya Raman"}'}]
    assert turn.content == "" and turn.finish_reason == "tool_calls"
    ids = data["prompt_token_ids"]
    assert turn.prompt_tokens == {"count": len(ids), "sha256": token_ids_hash(ids)}
    assert turn.usage == {"prompt_tokens": 5, "completion_tokens": 6}


def test_token_id_strings_give_the_ids_and_plain_openai_logprobs_give_none():
    turn = sampled_turn(fixture("answer_token_id_strings.json"))
    assert turn.token_ids == [17453, 13, 151645] and turn.logprobs == [-1.25, -0.5, -0.125]
    assert turn.content == "Done." and turn.prompt_tokens is None
    plain = sampled_turn(fixture("openai_logprobs_only.json"))
    assert plain.token_ids is None and plain.logprobs == [-1.25, -0.5]  # texts are not ids: nothing to align


def test_a_malformed_response_names_the_field():
    data = fixture("answer_token_id_strings.json")
    data["choices"][0]["logprobs"]["content"][1]["logprob"] = "-0.5"
    with pytest.raises(PolicyError, match=r"choices\[0\]\.logprobs\.content\[1\]\.logprob: expected a number"):
        sampled_turn(data)
    with pytest.raises(PolicyError, match="choices: empty"):
        sampled_turn({"choices": []})


def test_backoff_doubles_up_to_a_cap_and_follows_retry_after():
    waits = [backoff_seconds(a, 1.0) for a in range(8)]
    for a, w in enumerate(waits):
        assert min(2**a, 30) <= w <= 1.1 * min(2**a, 30)
    assert backoff_seconds(0, 1.0, retry_after="7") == 7.0
    assert backoff_seconds(3, 1.0, retry_after="soon") >= 8.0  # not a number: the doubling


# -- the end-to-end path --------------------------------------------------------------------------


class VLLMAnswers:
    """Answers chat completions with vLLM's fields (token_ids, logprobs.content, prompt_token_ids), sampled here
    from a real model at the request's temperature; log-probs are ``log_softmax(logits / T)`` of the sampled
    tokens (vLLM's ``--logprobs-mode processed_logprobs``)."""

    def __init__(self, model, tokenizer, seed: int = 0):
        self.model, self.tokenizer = model, tokenizer
        self.generator = torch.Generator().manual_seed(seed)

    def complete(self, body: dict) -> dict:
        messages = []
        for m in body["messages"]:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [
                    {
                        "type": "function",
                        "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])},
                    }
                    for c in m["tool_calls"]
                ]
            messages.append(m)
        prompt = self.tokenizer.apply_chat_template(
            messages, tools=body.get("tools"), add_generation_prompt=True, return_dict=False
        )
        ids, logprobs, step, cache = list(prompt), [], list(prompt), None
        with torch.no_grad():
            for _ in range(body["max_tokens"]):
                out = self.model(input_ids=torch.tensor([step]), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logp = torch.log_softmax(out.logits[0, -1].float() / body["temperature"], -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
                ids.append(tok)
                logprobs.append(float(logp[tok]))
                step = [tok]
                if tok == self.tokenizer.eos_token_id:
                    break
        out = ids[len(prompt) :]
        text = self.tokenizer.decode(out, skip_special_tokens=False)
        calls = [json.loads(c) for c in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.DOTALL)]
        content = re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL).replace("<|im_end|>", "")
        message = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                }
                for i, c in enumerate(calls)
            ]
        return {
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": {
                        "content": [
                            {"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(out, logprobs, strict=True)
                        ]
                    },
                    "finish_reason": "tool_calls" if calls else "stop",
                    "token_ids": out,
                }
            ],
            "prompt_token_ids": list(prompt),
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out)},
        }


@pytest.fixture(scope="module")
def sampler(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tool_calling_model(tmp_path_factory.mktemp("sampler") / "model")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def collect(sampler, verify_turn: str, temperature: float, jobs: list[Job]) -> list[dict]:
    model, tokenizer = sampler
    scenario = ScenarioSource.from_dir(LIBRARY).load("library_1")
    policy = OpenAIPolicy(VLLMAnswers(model, tokenizer), max_steps=3, max_tokens=8, temperature=temperature)
    records = []
    with ServerPool(2) as pool:
        pool.add(scenario)
        run = pooled_runner(pool, policy, verify_turn=verify_turn, format="chat-template")
        for record in run_jobs(jobs, run, concurrency=2):
            apply_alignment(record, align_record(tokenizer, record, verify_turn=verify_turn), "sampler")
            records.append(record)
    return records


def test_sampled_logprobs_become_behavior_logprobs_and_train_as_importance_ratio_denominators(sampler, tmp_path):
    from echo_trl.data.build import build_awm_dataset
    from echo_trl.demo.tiny import build_tiny_model
    from echo_trl.train.offline.collator import STARTING_LOGPS
    from echo_trl.trainer import EchoGRPOTrainer

    model, tokenizer = sampler
    temperature = 0.8
    jobs = [Job("library_1", k, i) for k in (0, 1) for i in range(2)]
    records = collect(sampler, "omit", temperature, jobs)
    assert sorted(r["metadata"]["episode"]["key"] for r in records) == sorted(j.key for j in jobs)
    for rec in records:  # the model's turns are exactly what the template renders: every one aligns
        check = rec["sampler"]["alignment"]
        assert check["status"] == "aligned", check
        assert check["aligned_turns"] == len(rec["sampler"]["turns"]) > 0
        assert rec["behavior_logprobs"] == [lp for t in rec["sampler"]["turns"] for lp in t["logprobs"]]
    summary = summarize(records)["logprobs"]
    assert summary["turns_flagged"] == 0 and summary["episodes_with_behavior_logprobs"] == 4
    path = tmp_path / "eps.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    ds = build_awm_dataset([path], verify_turn="omit")

    policy_model = build_tiny_model(tokenizer, "qwen2_5", hidden_size=32, num_layers=1, seed=1)  # not the sampler
    args = tiny_config(
        tmp_path / "run",
        per_device_train_batch_size=4,
        max_steps=2,
        max_completion_length=None,
        learning_rate=1e-2,
        temperature=temperature,
        behavior_policy="initial",
    )
    trainer = EchoGRPOTrainer(policy_model, args=args, train_dataset=ds, processing_class=tokenizer)
    assert STARTING_LOGPS not in trainer.train_dataset.column_names  # every row recorded its own: nothing forwarded
    inputs = batch(trainer)
    action = inputs["tool_mask"].bool() & inputs["completion_mask"].bool()
    old = inputs["old_per_token_logps"]
    with torch.no_grad():
        independent = reference_logps(model, inputs, temperature)  # the sampler's own forward of the trainer's ids
        now = reference_logps(trainer.model, inputs, temperature)
    torch.testing.assert_close(old[action], independent[action], atol=1e-4, rtol=0)
    assert torch.isnan(old[~action]).all()
    ratio = torch.exp(now[action] - old[action])
    assert (ratio - 1).abs().max() > 0.5  # another model than the sampler: the ratio is far from 1
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def test_a_turn_the_dataset_renders_otherwise_is_flagged_and_its_episode_keeps_no_logprobs(sampler):
    records = collect(sampler, "env_output", 1.0, [Job("library_1", 0, i) for i in range(3)])
    for rec in records:  # env_output renders the verifier step as an assistant verify call the model never wrote
        check = rec["sampler"]["alignment"]
        assert check["status"] == "flagged" and "behavior_logprobs" not in rec
        (flag,) = check["flagged"]
        assert "--verify-turn omit" in flag["reason"]
        if rec["steps"][-1]["action"]["arguments"].get("final_answer") is not None:
            assert flag["turn"] == len(rec["sampler"]["turns"]) - 1 and "token ids differ" in flag["reason"]
        else:  # max_steps reached: no answer turn, one assistant message more than turns sampled
            assert flag["turn"] == len(rec["sampler"]["turns"]) and "has no sampled turn" in flag["reason"]
        assert check["aligned_turns"] == len(rec["sampler"]["turns"]) - (flag["turn"] < len(rec["sampler"]["turns"]))


def test_a_prompt_the_server_rendered_otherwise_is_flagged(sampler):
    (rec,) = collect(sampler, "omit", 1.0, [Job("library_1", 2, 0)])
    _, tokenizer = sampler
    turn = rec["sampler"]["turns"][0]
    turn["prompt_tokens"] = {"count": turn["prompt_tokens"]["count"] + 1, "sha256": "0" * 16}
    check = align_record(tokenizer, rec, verify_turn="omit")
    assert check.status == "flagged" and check.behavior_logprobs is None
    assert check.flagged[0].turn == 0 and "another context" in check.flagged[0].reason
    turn["token_ids"] = turn["token_ids"][:-1]  # the server's count disagrees with its own log-probs
    assert "log-probs for" in align_record(tokenizer, rec, verify_turn="omit").flagged[0].reason
