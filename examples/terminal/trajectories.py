"""Scripted terminal sessions -> ECHO trajectories (for the warm start and the held-out env CE).

Training and held-out tasks use disjoint command lines: the held-out commands combine the same
commands with other files, flags and pipelines, so their outputs are new strings whose content and
format the world model can only predict by having learned how this terminal behaves.
"""

from __future__ import annotations

from transformers.utils import get_json_schema

from echo_trl.roles import Trajectory, tool_call

from .env import TerminalEnv

SYSTEM = "You are a helpful assistant working in a Linux terminal. Use the run tool to execute commands."

#: (task, commands) of the training tasks: also the online prompts.
TRAIN_TASKS: list[tuple[str, list[str]]] = [
    ("What files are in my home directory?", ["ls"]),
    ("Show my meeting notes.", ["cat notes.txt"]),
    ("How many lines does the sales file have?", ["wc -l /data/sales.csv"]),
    ("Show the first 3 lines of the app log.", ["head -n 3 /var/log/app.log"]),
    ("Find the errors in the app log.", ["grep ERROR /var/log/app.log"]),
    ("What is in the data directory?", ["ls -l /data"]),
    ("Show the app config.", ["cat projects/app/config.yaml"]),
    ("Which users are developers?", ["grep dev /data/users.csv"]),
    ("Show the last 2 entries of the app log.", ["tail -n 2 /var/log/app.log"]),
    ("What is the hostname?", ["cat /etc/hostname"]),
    ("List the app project files.", ["ls projects/app"]),
    ("Show my todo list.", ["cat todo.md"]),
    ("How many widget sales were there?", ["grep widget /data/sales.csv", "grep -c widget /data/sales.csv"]),
    ("Where am I?", ["pwd"]),
    ("Show the users file.", ["cat /data/users.csv"]),
    ("Show the hosts file.", ["cat /etc/hosts"]),
    ("Read the project README.", ["cat projects/app/README.md"]),
    ("Find all CSV files.", ["find / -name '*.csv'"]),
    ("How many words are in my notes?", ["wc -w notes.txt"]),
    ("Show the first 2 lines of the sales file.", ["head -n 2 /data/sales.csv"]),
    ("Show the warnings in the app log.", ["grep WARN /var/log/app.log"]),
    ("Open the broken file report.txt.", ["cat report.txt", "ls"]),
]

#: Held-out tasks: command lines never issued in training.
HELDOUT_TASKS: list[tuple[str, list[str]]] = [
    ("Show the last 3 lines of the sales file.", ["tail -n 3 /data/sales.csv"]),
    ("Which log lines mention the database?", ["grep -n database /var/log/app.log"]),
    ("How many users are there?", ["wc -l /data/users.csv"]),
    ("Show the first line of my todo list.", ["head -n 1 todo.md"]),
    ("Which sales were in the north region?", ["grep north /data/sales.csv"]),
    ("Show the app entry point.", ["head -n 8 projects/app/main.py"]),
    ("Which todo items are renewals?", ["grep -i renew todo.md"]),
    ("Count the successful GET requests.", ["grep GET /var/log/app.log | wc -l"]),
    ("What is the app port?", ["grep port projects/app/config.yaml"]),
    ("List the log directory in detail.", ["ls -l /var/log"]),
    ("Show the ops users.", ["cat /data/users.csv | grep ops"]),
    ("Show lines 2-3 of my notes.", ["head -n 3 notes.txt | tail -n 2"]),
]


def tool_schemas() -> list[dict]:
    return [get_json_schema(TerminalEnv.run)]


def session(task: str, commands: list[str], *, reward: float | None = None, group: str = "") -> Trajectory:
    """Run ``commands`` in a fresh :class:`TerminalEnv` and record the conversation."""
    env = TerminalEnv()
    env.reset()
    completion: list[dict] = []
    for cmd in commands:
        completion.append({"role": "assistant", "content": "", "tool_calls": [tool_call("run", {"command": cmd})]})
        completion.append({"role": "tool", "name": "run", "content": env.run(cmd)})
    completion.append({"role": "assistant", "content": "Done."})
    return Trajectory(
        prompt=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}],
        completion=completion,
        tools=tool_schemas(),
        reward=env.get_reward() if reward is None else reward,
        scenario="terminal",
        task_idx=0,
        group_id=group or task,
    )


def trajectories(tasks: list[tuple[str, list[str]]]) -> list[Trajectory]:
    return [session(task, cmds) for task, cmds in tasks]
