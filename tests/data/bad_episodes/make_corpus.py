"""Regenerate the bad-episode corpus: ``python tests/data/bad_episodes/make_corpus.py``.

Each case is one file holding one bad record; ``cases.tsv`` maps the file name to the error
text strict loading must raise (after ``FILE[:RECORD]: ``); ``good/episode.json`` is a valid
episode to load beside each case (lenient loading must keep it). The files are committed; this
script documents how each was made.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

HERE = Path(__file__).parent

GOOD = {
    "scenario": "shop_1",
    "task": "Add a notebook to my cart.",
    "task_idx": 0,
    "tools": ["search", "add"],
    "steps": [
        {
            "action": {"tool_name": "search", "arguments": {"q": "notebook"}},
            "observation": {"tool_result": '{"items": [{"id": 7}]}', "reward_type": "tool_call_ok", "done": False},
        },
        {
            "action": {"tool_name": "verify", "arguments": {}},
            "observation": {"verify_result": {"result": "complete"}, "reward_type": "complete", "done": True},
        },
    ],
    "reward": 1.0,
}
SESSION = {
    "scenario": "shop_1",
    "task": "Find item 7.",
    "task_idx": 0,
    "steps": 1,
    "trajectory": [
        {
            "action": "call_tool",
            "tool_name": "get",
            "arguments": {"id": 7},
            "success": True,
            "result": {"id": 7},
            "reward": 1.0,
        }
    ],
}


def mutate(fn, base=GOOD):
    ep = copy.deepcopy(base)
    fn(ep)
    return json.dumps(ep)


CASES: dict[str, tuple[str | bytes, str]] = {
    "invalid_json.json": ('{"scenario": "shop_1", "task": ', "invalid JSON"),
    "invalid_utf8.json": (b'{"scenario": "shop\xff\xfe", "task": "x"}', "invalid UTF-8 at byte 18"),
    "empty_file.json": ("", "invalid JSON"),
    "top_level_string.json": ('"just a string"', "expected an episode object, got a string"),
    "list_of_numbers.json": ("[1, 2]", "expected an episode object, got an integer"),
    "missing_scenario.json": (mutate(lambda e: e.pop("scenario")), "scenario: missing"),
    "scenario_not_string.json": (
        mutate(lambda e: e.update(scenario=33)),
        "scenario: expected a string, got an integer",
    ),
    "missing_task.json": (mutate(lambda e: e.pop("task")), "task: missing"),
    "empty_task.json": (mutate(lambda e: e.update(task="  ")), "task: expected a non-empty task"),
    "task_idx_string.json": (mutate(lambda e: e.update(task_idx="0")), "task_idx: expected an integer, got a string"),
    "task_idx_float.json": (mutate(lambda e: e.update(task_idx=1.5)), "task_idx: expected an integer, got a number"),
    "task_idx_bool.json": (mutate(lambda e: e.update(task_idx=True)), "task_idx: expected an integer, got a boolean"),
    "empty_steps.json": (mutate(lambda e: e.update(steps=[])), "steps: episode has no tool calls"),
    "steps_not_list.json": (
        mutate(lambda e: e.update(steps={"0": {}})),
        "steps: expected a list of steps, got an object",
    ),
    "step_not_object.json": (
        mutate(lambda e: e["steps"].insert(0, "search")),
        "steps[0]: expected an object with action and observation, got a string",
    ),
    "action_without_observation.json": (
        mutate(lambda e: e["steps"][1].pop("observation")),
        "steps[1].observation: missing",
    ),
    "observation_without_action.json": (mutate(lambda e: e["steps"][0].pop("action")), "steps[0].action: missing"),
    "tool_name_null.json": (
        mutate(lambda e: e["steps"][0]["action"].update(tool_name=None)),
        "steps[0].action.tool_name: expected a string, got null",
    ),
    "tool_name_number.json": (
        mutate(lambda e: e["steps"][0]["action"].update(tool_name=7)),
        "steps[0].action.tool_name: expected a string, got an integer",
    ),
    "tool_name_empty.json": (
        mutate(lambda e: e["steps"][0]["action"].update(tool_name="")),
        "steps[0].action.tool_name: expected a non-empty tool name",
    ),
    "arguments_list.json": (
        mutate(lambda e: e["steps"][0]["action"].update(arguments=["q"])),
        "steps[0].action.arguments: expected an object of tool arguments, got a list",
    ),
    "arguments_bad_json_string.json": (
        mutate(lambda e: e["steps"][0]["action"].update(arguments="{q: 1")),
        "steps[0].action.arguments: arguments string is not valid JSON",
    ),
    "observation_without_output.json": (
        mutate(lambda e: e["steps"][0]["observation"].pop("tool_result")),
        "steps[0].observation: expected one of tool_result, error, verify_result",
    ),
    "observation_not_object.json": (
        mutate(lambda e: e["steps"][0].update(observation="ok")),
        "steps[0].observation: expected an object, got a string",
    ),
    "reward_nan.json": (
        mutate(lambda e: e.update(reward=0.0)).replace('"reward": 0.0', '"reward": NaN'),
        "invalid JSON: non-finite number NaN is not valid JSON",
    ),
    "reward_infinity.json": (
        mutate(lambda e: e.update(reward=0.0)).replace('"reward": 0.0', '"reward": -Infinity'),
        "invalid JSON: non-finite number -Infinity is not valid JSON",
    ),
    "reward_string.json": (mutate(lambda e: e.update(reward="1.0")), "reward: expected a number, got a string"),
    "reward_missing.json": (
        mutate(lambda e: e.pop("reward")),
        "reward: missing (and no reward_type to derive it from)",
    ),
    "duplicate_keys.json": ('{"scenario": "a", "task": "t", "task": "u"}', "invalid JSON: duplicate key 'task'"),
    "tools_not_list.json": (
        mutate(lambda e: e.update(tools="search,add")),
        "tools: expected a list of tool names or tool objects, got a string",
    ),
    "tool_without_name.json": (mutate(lambda e: e.update(tools=[{"description": "x"}])), "tools[0].name: missing"),
    "tool_schema_not_object.json": (
        mutate(lambda e: e.update(tools=[{"name": "a", "inputSchema": "object"}])),
        "tools[0].inputSchema: expected a JSON schema object, got a string",
    ),
    "warning_not_string.json": (
        mutate(lambda e: e["steps"][0]["observation"].update(warning=[{"w": 1}])),
        "steps[0].observation.warning[0]: expected a string, got an object",
    ),
    "behavior_logprobs_null.json": (
        mutate(lambda e: e.update(behavior_logprobs=[-0.1, None])),
        "behavior_logprobs[1]: expected a number, got null",
    ),
    "neither_steps_nor_trajectory.json": (
        mutate(lambda e: e.pop("steps")),
        "steps: missing (expected steps or trajectory)",
    ),
    "session_unknown_action.json": (
        mutate(lambda e: e["trajectory"][0].update(action="teleport"), SESSION),
        "trajectory[0].action: unknown action 'teleport'",
    ),
    "session_missing_result.json": (
        mutate(lambda e: e["trajectory"][0].pop("result"), SESSION),
        "trajectory[0].result: missing observation",
    ),
    "deeply_nested.json": ("[" * 100_000 + "]" * 100_000, "invalid JSON"),
    # Content Python reads but no UTF-8 writer or int64/float64 column can hold (issue 13):
    "lone_surrogate_task.json": (
        mutate(lambda e: e.update(task="\ud800 Add a notebook")),
        r"task: lone surrogate '\ud800' at character 0 is not valid Unicode text",
    ),
    "lone_surrogate_argument_key.json": (
        mutate(lambda e: e["steps"][0]["action"].update(arguments={"\udfff": 1})),
        "steps[0].action.arguments (a key): lone surrogate",
    ),
    "lone_surrogate_tool_output.json": (
        mutate(lambda e: e["steps"][0]["observation"].update(tool_result="ok \udc80")),
        r"steps[0].observation.tool_result: lone surrogate '\udc80' at character 3",
    ),
    "lone_surrogate_in_argument_string.json": (
        mutate(lambda e: e["steps"][0]["action"].update(arguments='{"q": "\\ud800"}')),
        "steps[0].action.arguments.q: lone surrogate",
    ),
    "arguments_string_nested_5000.json": (
        mutate(lambda e: e["steps"][0]["action"].update(arguments='{"a": ' + "[" * 5000 + "]" * 5000 + "}")),
        "steps[0].action.arguments: arguments string is not valid JSON (nested too deeply)",
    ),
    "reward_400_zeros.json": (
        mutate(lambda e: e.update(reward=10**400)),
        "reward: number out of range (an integer too large for a float)",
    ),
    "reward_float_overflow.json": (
        mutate(lambda e: e.update(reward=0.0)).replace('"reward": 0.0', '"reward": 1e400'),
        "invalid JSON: number 1e400 is out of range",
    ),
    "task_idx_1e23.json": (
        mutate(lambda e: e.update(task_idx=0)).replace('"task_idx": 0', '"task_idx": 1e23'),
        "task_idx: expected an integer, got a number",
    ),
    "task_idx_beyond_int64.json": (
        mutate(lambda e: e.update(task_idx=10**23)),
        "task_idx: integer out of range (the dataset stores a 64-bit integer)",
    ),
    "integer_5000_digits.json": (
        mutate(lambda e: e.update(task_idx=0)).replace('"task_idx": 0', '"task_idx": ' + "9" * 5000),
        "invalid JSON: Exceeds the limit",
    ),
    "behavior_logprobs_huge_integer.json": (
        mutate(lambda e: e.update(behavior_logprobs=[-(10**400)])),
        "behavior_logprobs[0]: number out of range (an integer too large for a float)",
    ),
    "session_reward_huge_integer.json": (
        mutate(lambda e: e["trajectory"][0].update(reward=10**400), SESSION),
        "trajectory[0].reward: number out of range (an integer too large for a float)",
    ),
}


def main() -> None:
    for old in HERE.glob("*.json"):
        old.unlink()
    for name, (content, _) in CASES.items():
        (HERE / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (HERE / "cases.tsv").write_text("".join(f"{name}\t{msg}\n" for name, (_, msg) in sorted(CASES.items())))
    (HERE / "good").mkdir(exist_ok=True)
    (HERE / "good" / "episode.json").write_text(json.dumps(GOOD))


if __name__ == "__main__":
    main()
