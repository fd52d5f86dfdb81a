"""Recorded AWM episodes (both shapes) and trajectories the tests build datasets from."""

from __future__ import annotations

from echo_trl.roles import Trajectory, tool_call


def openenv_episode(**overrides):
    ep = {
        "scenario": "shop_1",
        "task": "Add a notebook to my cart.",
        "task_idx": 2,
        "tools": ["search", "add_to_cart"],
        "steps": [
            {
                "action": {"tool_name": "search", "arguments": {"q": "notebook"}},
                "observation": {
                    "tool_result": '{"items": [{"id": 7}]}',
                    "warning": "3 steps left",
                    "reward_type": "tool_call_ok",
                    "done": False,
                },
            },
            {
                "action": {"tool_name": "add_to_cart", "arguments": {"id": "x"}},
                "observation": {"error": "422: id must be an integer", "reward_type": "format_error"},
            },
            {
                "action": {"tool_name": "verify", "arguments": {"verifier_mode": "code"}},
                "observation": {"verify_result": {"result": "others"}, "reward_type": "others", "done": True},
            },
        ],
        "reward": 0.0,
    }
    ep.update(overrides)
    return ep


def session_episode():
    return {
        "scenario": "shop_1",
        "task": "Find item 7.",
        "task_idx": 0,
        "steps": 3,
        "trajectory": [
            {
                "action": "list_tools",
                "result": {
                    "tools": [
                        {
                            "name": "get_item",
                            "description": "Get an item.",
                            "inputSchema": {"type": "object", "properties": {"id": {"type": "integer"}}},
                        }
                    ]
                },
            },
            {
                "action": "call_tool",
                "tool_name": "get_item",
                "arguments": {"id": 7},
                "success": True,
                "result": {"id": 7, "title": "Notebook"},
                "reward_type": "tool_call_ok",
                "reward": 0.0,
            },
            {
                "action": "call_tool",
                "tool_name": "get_item",
                "arguments": '{"id": 99}',
                "success": False,
                "error": "404 not found",
                "reward_type": "tool_call_error",
            },
            {
                "action": "verify",
                "tool_name": "verify",
                "arguments": {},
                "verify_result": {"result": "complete"},
                "reward_type": "complete",
                "reward": 1.0,
            },
        ],
    }


def traj(
    outputs=('{"items": [1, 2]}', "Error: no such product"),
    warnings=None,
    behavior=None,
    tools=("search", "add"),
    reward=1.0,
    group="g",
):
    completion = []
    for i, out in enumerate(outputs):
        completion.append(
            {"role": "assistant", "content": "", "tool_calls": [tool_call(tools[i % len(tools)], {"q": f"x{i}"})]}
        )
        completion.append({"role": "tool", "name": tools[i % len(tools)], "content": out})
    ws = warnings or [[] for _ in completion]
    return Trajectory(
        prompt=[{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Buy a lamp."}],
        completion=completion,
        warnings=ws,
        reward=reward,
        group_id=group,
        scenario="shop",
        task_idx=0,
        tools=[
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": "",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            }
            for n in tools
        ],
        behavior_logprobs=behavior,
    )
