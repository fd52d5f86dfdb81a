"""The AWM scenario as a TRL environment_factory: generated tool methods, reward, plain GRPOTrainer steps."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

from echo_trl.envs.awm.online.dataset import awm_task_dataset
from echo_trl.envs.awm.online.environment import awm_environment_factories, awm_environment_factory, close_environments
from echo_trl.envs.awm.online.tools import make_tool_method
from echo_trl.envs.awm.runtime.pool import ServerPool
from echo_trl.envs.awm.scenario.source import ScenarioSource, VerifierSpec

SAMPLES = Path(__file__).resolve().parents[5] / "shared" / "data" / "awm1k_samples"
SUBSCRIBED = (
    "def verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
    "    import sqlite3\n"
    "    c = sqlite3.connect(final_db_path)\n"
    "    n = c.execute('select count(*) from user_subscriptions where user_id=1 and channel_id=1').fetchone()[0]\n"
    "    return {'result': 'complete' if n else 'others'}\n"
)


def _scenario():
    if not SAMPLES.is_dir():
        pytest.skip(f"shared AWM-1K samples not found at {SAMPLES} (they live in ../shared/data, not in the repo)")
    sc = ScenarioSource.from_dir(SAMPLES).load("content_platform_1")
    # the sample has no verifier: give task 0 a small one (subscribed to channel 1?) to see rewards move
    sc.verifiers[(0, "code")] = VerifierSpec(sc.name, 0, "code", SUBSCRIBED, "verify_task_completion", "test")
    return sc


@pytest.fixture(scope="module")
def factory():
    f = awm_environment_factory(_scenario())
    yield f
    close_environments()


def _tool_names(cls) -> list[str]:
    return [
        n
        for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not n.startswith("_") and n not in ("reset", "get_reward")
    ]


def test_tools_are_methods_trl_and_transformers_accept(factory):
    from transformers.utils import get_json_schema

    cls = factory.environment_class
    names = _tool_names(cls)
    assert len(names) == 35 and "search_channels" in names and "verify" in names  # 34 MCP tools + verify
    schemas = {n: get_json_schema(getattr(cls, n)) for n in names}
    s = schemas["search_channels"]["function"]
    assert s["parameters"]["required"] == ["query"]
    assert s["parameters"]["properties"]["query"]["type"] == "string"
    assert "### Responses" not in s["description"]
    assert s["parameters"]["properties"]["limit"]["description"].endswith("(default: 10)")
    assert schemas["verify"]["function"]["parameters"]["properties"]["final_answer"]["type"] == "string"


def test_schema_defaults_and_enums_reach_the_schema_trl_derives(factory):
    """TRL renders each tool method through transformers' get_json_schema: count what survives."""
    from transformers.utils import get_json_schema

    cls = factory.environment_class
    props = [p for t in cls._tools for p in (t["inputSchema"].get("properties") or {}).values()]
    derived = [
        p
        for n in _tool_names(cls)
        if n != "verify"
        for p in get_json_schema(getattr(cls, n))["function"]["parameters"]["properties"].values()
    ]
    assert len(derived) == len(props)
    with_default = sum("default" in p for p in props)
    assert with_default == 16  # content_platform_1's MCP schemas (what the issue counted)
    assert sum("(default: " in p["description"] for p in derived) == with_default
    assert sum("enum" in p for p in derived) == sum("enum" in p for p in props)


def test_argument_docs_keep_defaults_and_choices_json_schema_parses():
    from transformers.utils import get_json_schema

    tool = {
        "name": "t",
        "description": "T.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "order": {
                    "type": "string",
                    "enum": ["asc", "desc"],
                    "default": "asc",
                    "description": "Sort (a) order.",
                },
                "n": {"type": "integer", "default": 5},
            },
        },
    }
    schema = get_json_schema(make_tool_method(tool, "t"))["function"]["parameters"]["properties"]
    assert schema["order"]["enum"] == ["asc", "desc"]
    assert schema["order"]["description"] == 'Sort (a) order. (default: "asc")'
    assert schema["n"]["description"] == "n (default: 5)"


def test_reset_tools_and_reward(factory):
    env = factory()
    task = env.reset(task_idx=0, prompt=[{"role": "user", "content": ""}])
    assert task.startswith("Search for the channel 'Kurzgesagt")
    assert env.reset(task_idx=0, prompt=[{"role": "user", "content": "task text"}]) is None
    assert '"Kurzgesagt' in env.search_channels(query="Kurzgesagt")
    assert '"subscription"' in env.subscribe_to_channel(channel_id=1)
    assert env.get_reward() == 1.0
    assert env._episode_record()["steps"][-1]["observation"]["reward_type"] == "complete"
    env.reset(task_idx=0)  # database restored: no subscription any more
    assert env.get_reward() == 0.0
    env.reset(task_idx=0)
    assert env.search_channels(query=5).startswith("Input validation error")
    assert '"subscription"' in env.subscribe_to_channel(channel_id=1)  # AWM: the rollout goes on
    assert env.get_reward() == -1.0  # ... and its reward stays the format-error reward
    assert env._episode.verifier_reward == 1.0


def test_verify_tool_ends_the_episode_in_the_conversation(factory):
    import json

    env = factory()
    env.reset(task_idx=0)
    env.subscribe_to_channel(channel_id=1)
    out = env.verify(final_answer="Subscribed.")
    assert json.loads(out)["result"] == "complete"
    assert env.search_channels(query="x") == "the episode has ended; start a new episode"
    assert env.get_reward() == 1.0
    record = env._episode_record()
    assert record["steps"][-2]["action"]["tool_name"] == "verify" and "verification" not in record


def test_omit_and_stop_on_format_error():
    with ServerPool(1) as pool:
        f = awm_environment_factory(_scenario(), verify_turn="omit", stop_on_format_error=True, pool=pool)
        cls = f.environment_class
        assert "verify" not in _tool_names(cls) and len(_tool_names(cls)) == 34
        env = f()
        env.reset(task_idx=0)
        env.subscribe_to_channel(channel_id=1)
        assert env.get_reward() == 1.0
        record = env._episode_record()
        assert [s["action"]["tool_name"] for s in record["steps"]] == ["subscribe_to_channel"]
        assert record["verification"]["observation"]["reward_type"] == "complete"
        env.reset(task_idx=0)
        env.search_channels(query=5)
        assert env.subscribe_to_channel(channel_id=1) == "the episode has ended; start a new episode"
        assert env.get_reward() == -1.0


def test_rows_route_to_their_scenarios_environment(tmp_path):
    library = ScenarioSource.from_dir(Path(__file__).resolve().parents[4] / "data" / "awm_scenarios").load("library_1")
    content = _scenario()
    brace = 'Answer as JSON like {"ok": true} in {scenario}.'
    ds = awm_task_dataset([library, content], {"library_1": [0, 1], "content_platform_1": [0]}, system_prompt=brace)
    assert ds["environment"] == ds["scenario"] == ["library_1", "content_platform_1", "library_1"]
    assert ds["prompt"][1][0]["content"] == 'Answer as JSON like {"ok": true} in content_platform_1.'
    with ServerPool(1) as pool:
        factories = awm_environment_factories([library, content], pool=pool)
        env = factories["library_1"]()
        with pytest.raises(ValueError, match="got a row of scenario 'content_platform_1'"):
            env.reset(**{k: ds[1][k] for k in ("prompt", "task_idx", "scenario")})
        env.reset(**{k: ds[0][k] for k in ("prompt", "task_idx", "scenario")})
        other = factories["content_platform_1"]()
        other.reset(**{k: ds[1][k] for k in ("prompt", "task_idx", "scenario")})
        assert '"members"' in env.search_members(query="Priya Raman")
        assert "Kurzgesagt" in other.search_channels(query="Kurzgesagt")
        assert len(pool.live_servers()) == 1 and env._pool is other._pool is pool


def test_make_tool_method_maps_names_and_drops_unset_optionals():
    calls = []

    class Fake:
        def _call(self, name, arguments):
            calls.append((name, arguments))
            return "ok"

    tool = {
        "name": "odd-tool",
        "description": "Does things.",
        "inputSchema": {
            "type": "object",
            "required": ["user-id"],
            "properties": {
                "user-id": {"type": "integer", "description": "who"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "class": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            },
        },
    }
    m = make_tool_method(tool, "odd_tool")
    params = list(inspect.signature(m).parameters)
    assert params == ["self", "user_id", "tags", "tool_class"]
    assert m(Fake(), user_id=3, tool_class="x") == "ok"
    assert calls == [("odd-tool", {"user-id": 3, "class": "x"})]


def test_plain_grpo_trainer_runs_online_steps(factory, tmp_path):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from echo_trl.demo.tiny import ensure_tiny_model

    path = ensure_tiny_model(tmp_path / "tiny", family="qwen3", hidden_size=32, vocab_size=512)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ds = awm_task_dataset(factory.environment_class._scenario, [0], repeats=4)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=16,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        max_tool_calling_iterations=2,
        bf16=False,
    )
    trainer = GRPOTrainer(model=model, processing_class=tok, args=args, train_dataset=ds, environment_factory=factory)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 2
    key = f"rewards/{factory.environment_class.__name__}/mean"
    assert all(key in h for h in logs)
    envs = trainer.environments
    assert len(envs) == 2 and all(e._episode is not None and e._episode.done for e in envs)
    # the batch's servers were started ahead, one per open session at most, all of this one scenario
    live = envs[0]._pool.live_servers()
    assert 1 <= len(live) <= len(envs) and {name for name, _ in live} == {factory.environment_class._scenario.name}
