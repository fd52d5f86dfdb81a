"""A batch's environment work in flight together: TRL 1.16's own tool loop and reward path, with environments that
declare ``concurrent_rollouts``, run the rollouts' tool calls and ``get_reward`` in threads, with the serial run's
calls (each rollout's in its order), results, errors and rewards; and the AWM pool starts servers ahead of them."""

from __future__ import annotations

import threading
import time

import pytest
from datasets import Dataset
from helpers.tiny import tiny_model, tiny_tokenizer

from echo_trl.config import EchoGRPOConfig
from echo_trl.envs.awm.runtime import pool as pool_module
from echo_trl.envs.awm.runtime.pool import ServerPool
from echo_trl.train.online.rollout_threads import ToolPrefetch
from echo_trl.trainer import EchoGRPOTrainer

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

PAUSE = 0.25  # seconds a tool call or a verification waits (on I/O: no CPU needed)


def environment(concurrent: bool):
    class Env:
        concurrent_rollouts = concurrent

        def __init__(self):
            self.calls, self.verified = [], 0

        def reset(self, **kwargs):
            self.calls, self.verified, self.city = [], 0, kwargs["prompt"][-1]["content"].split()[-1]
            return None

        def lookup(self, city: str) -> str:
            """Weather of a city.

            Args:
                city: the city name.
            """
            self.calls.append(("lookup", city, threading.current_thread().name))
            time.sleep(PAUSE)
            if city == "Nowhere":
                raise ValueError("no such city")
            return f"{len(self.calls)} sunny in {city}"

        def get_reward(self) -> float:
            if not self.verified:
                time.sleep(PAUSE)
            self.verified += 1
            return float(len(self.city))

    return Env


def trainer(tmp_path, concurrent: bool) -> EchoGRPOTrainer:
    tok = tiny_tokenizer("qwen3")
    cities = ["Paris", "Oslo", "Nowhere", "Lima"]
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Weather in {c}"}] for c in cities]})
    t = EchoGRPOTrainer(
        tiny_model(),
        args=EchoGRPOConfig(
            output_dir=str(tmp_path / f"c{int(concurrent)}"),
            per_device_train_batch_size=4,
            num_generations=2,
            max_steps=1,
            use_cpu=True,
            bf16=False,
            report_to="none",
            max_completion_length=256,
            gradient_checkpointing=False,
            disable_tqdm=True,
            max_tool_calling_iterations=3,
        ),
        train_dataset=prompts,
        processing_class=tok,
        environment_factory=environment(concurrent),
    )
    turn = {"n": 0}

    def scripted(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """Turn 1: every row calls lookup twice (its own city, then Paris); turn 2: two rows call once more."""
        turn["n"] += 1
        out = []
        for i, ids in enumerate(prompt_ids):
            city = tok.decode(ids).split("Weather in ")[1].split("<")[0]
            calls = [city, "Paris"] if turn["n"] == 1 else [city] if turn["n"] == 2 and i % 2 == 0 else []
            text = "".join(
                f'<tool_call>\n{{"name": "lookup", "arguments": {{"city": "{c}"}}}}\n</tool_call>' for c in calls
            )
            out.append(tok(text + ("" if calls else "Done.") + "<|im_end|>", add_special_tokens=False)["input_ids"])
        return out, None

    t._generate_single_turn = scripted
    t.model.train()
    return t


def test_tool_calls_and_rewards_of_a_batch_run_together_with_the_serial_results(tmp_path):
    runs = {}
    for concurrent in (False, True):
        t = trainer(tmp_path, concurrent)
        rows = list(t.train_dataset)
        start = time.perf_counter()
        out = t._generate_and_score_completions([r for r in rows for _ in range(2)])
        runs[concurrent] = (time.perf_counter() - start, t.environments, out)
    (serial_s, serial_envs, serial_out), (fast_s, envs, out) = runs[False], runs[True]
    # the same calls, each rollout's in its order, with the same results (and the same error) and rewards
    strip = lambda env: [c[:2] for c in env.calls]  # noqa: E731
    assert [strip(e) for e in envs] == [strip(e) for e in serial_envs]
    assert sum(len(e.calls) for e in envs) == 8 * 2 + 4  # two calls per rollout, then one for half of them
    assert out["completion_ids"].tolist() == serial_out["completion_ids"].tolist()  # tool results (and errors) in
    assert out["advantages"].tolist() == serial_out["advantages"].tolist()
    assert all(e.verified == 2 for e in envs)  # once in the pool, once from TRL's serial call (its first result)
    assert {c[2] for e in serial_envs for c in e.calls} == {"MainThread"}
    assert all(c[2].startswith("echo-rollout") for e in envs for c in e.calls)
    # 8 rollouts x (2 + 1 calls over two iterations) + 8 verifications, one PAUSE each: serially >= 28 pauses;
    # in flight together: per iteration the longest rollout (2 pauses, then 1), and one for the verifications
    assert serial_s > 28 * PAUSE and fast_s < serial_s / 3


def test_prefetch_refuses_a_call_it_did_not_dispatch():
    completions = [
        [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]
    ]
    seen = []
    tools = [{"f": lambda x: seen.append(x) or x}]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        prefetch = ToolPrefetch(completions, tools, pool)
        assert prefetch.dicts[0]["f"](x=1) == 1
        with pytest.raises(RuntimeError, match="prefetched call was None"):  # loud, never a wrong result
            prefetch.dicts[0]["f"](x=2)
    assert seen == [1]


def test_pool_warms_one_server_per_open_session_within_the_bound(monkeypatch):
    """``warm`` starts servers in the background (reserved against the bound while they start), one per open session
    of the scenario; a starting server is busy (a call waits for it); nothing starts after close."""
    started, gate = [], threading.Event()

    def fake_start(self, slot, scenario):
        gate.wait(5)
        slot.runtime = object()
        started.append(slot.state.id)

    class Scenario:
        name = "s"

    monkeypatch.setattr(ServerPool, "_start", fake_start)
    monkeypatch.setattr(pool_module, "_close_slot", lambda slot: None)
    pool = ServerPool(3, unsafe_no_sandbox=True)
    pool._scenarios["s"] = Scenario()
    pool._open_sessions["s"] = 5
    assert pool.warm("s") == 3  # five sessions, a bound of three
    assert len(pool._slots) == 3 and all(s.state.in_use for s in pool._slots.values())  # starting = busy
    assert pool.warm("s") == 0  # already at the bound
    gate.set()
    deadline = time.monotonic() + 5
    while len(started) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(started) == 3 and not any(s.state.in_use for s in pool._slots.values())
    pool.close()
    assert pool.warm("s") == 0
