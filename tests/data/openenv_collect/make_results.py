"""Regenerate ``results.jsonl`` / ``metadata.json`` here with OpenEnv's own collector (dev time only).

    /root/.pyenv/versions/3.12.1/bin/python -m venv /work/venv-openenv
    /work/venv-openenv/bin/pip install openenv==0.10
    /work/venv-openenv/bin/python tests/data/openenv_collect/make_results.py

Runs ``openenv.core.harness.collect.CollectRunner`` (the code behind ``openenv collect``) with
OpenEnv's ``MCPHarnessAdapter`` and ``RolloutSerializer`` on a tiny scripted session (two
library tools, one failing call) and a scripted model, so the files are exactly what
``openenv collect`` writes. Only this script's own toy data goes in; nothing of OpenEnv is copied.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import HarnessRunLimits, MCPHarnessAdapter, ModelStepResult
from openenv.core.harness.collect import CollectRunner, RolloutSerializer
from openenv.core.harness.rollout import ResourceSession, ResourceSessionFactory, ToolResult, VerifyResult
from openenv.core.llm_client import LLMResponse, ToolCall

HERE = Path(__file__).resolve().parent
TOOLS = [
    Tool(
        name="find_member",
        description="Find a member by card number.",
        input_schema={"type": "object", "properties": {"card": {"type": "string"}}, "required": ["card"]},
    ),
    Tool(
        name="list_loans",
        description="List a member's loans.",
        input_schema={"type": "object", "properties": {"member_id": {"type": "integer"}}},
    ),
]
TASKS = [
    {"scenario": "library_1", "task_idx": 3, "task": "How many loans does card 2001-0042 have?"},
    {"scenario": "library_1", "task_idx": 3, "task": "How many loans does card 2001-0042 have?"},
]
#: Per episode: the model's turns (tool calls, then a final answer).
SCRIPTS = [
    [[("find_member", {"card": "2001-0042"})], [("list_loans", {"member_id": 42})], "Card 2001-0042 has 2 loans."],
    [[("list_loans", {"member_id": "forty-two"})], "I could not find the loans."],
]


class Session(ResourceSession):
    def __init__(self, task, episode_id):
        self.task, self.episode_id = task, episode_id

    def initial_messages(self):
        return [
            {"role": "system", "content": "You are the library's desk assistant."},
            {"role": "user", "content": self.task["task"]},
        ]

    def list_tools(self):
        return list(TOOLS)

    def call_tool(self, name, arguments):
        if name == "find_member":
            return ToolResult(data={"member": {"id": 42, "name": "Ada Byron"}})
        if not isinstance(arguments.get("member_id"), int):
            return ToolResult(data="Error: member_id must be an integer", error="invalid arguments")
        return ToolResult(data={"loans": [{"id": 1}, {"id": 2}]})

    def verify(self, transcript, final_state=None):
        answer = transcript[-1].get("content") or ""
        return VerifyResult(
            env_reward=1.0 if "2 loans" in answer else 0.0, done=True, metrics={"answer_chars": len(answer)}
        )

    def close(self):
        pass


class Factory(ResourceSessionFactory):
    def create(self, task, seed=None, episode_id=None):
        return Session(task, episode_id)


def main() -> None:
    turns = {i: iter(script) for i, script in enumerate(SCRIPTS)}
    episode = {"i": -1}

    def model_step(messages, tools, sampling):
        if len(messages) == 2:  # a new episode starts with system + user
            episode["i"] += 1
        turn = next(turns[episode["i"]])
        if isinstance(turn, str):
            return ModelStepResult(response=LLMResponse(content=turn))
        calls = [
            ToolCall(id=f"call_{episode['i']}_{len(messages)}_{k}", name=n, args=a) for k, (n, a) in enumerate(turn)
        ]
        return ModelStepResult(response=LLMResponse(content="", tool_calls=calls))

    out = HERE / "out"
    shutil.rmtree(out, ignore_errors=True)
    serializer = RolloutSerializer(out)
    runner = CollectRunner(
        session_factory=Factory(),
        harness_adapter=MCPHarnessAdapter(),
        serializer=serializer,
        tasks=TASKS,
        limits=HarnessRunLimits(max_turns=5),
    )
    result = runner.run(model_step=model_step, num_episodes=len(SCRIPTS), resume=False)
    serializer.write_metadata({"env": "scripted library desk", "episodes": result.num_collected})
    for name in ("results.jsonl", "metadata.json"):
        shutil.move(out / name, HERE / name)
    shutil.rmtree(out)
    print(result)


if __name__ == "__main__":
    main()
