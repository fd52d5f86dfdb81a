"""The sandboxed terminal example: commands, errors, no escape from the virtual FS, reset, TRL contract."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.terminal.env import FILES, HOME, Shell, TerminalEnv, VirtualFS  # noqa: E402
from examples.terminal.trajectories import HELDOUT_TASKS, TRAIN_TASKS, session  # noqa: E402


@pytest.fixture
def sh():
    return Shell()


def test_commands(sh):
    assert sh.run("pwd") == (HOME + "\n", 0)
    assert sh.run("ls") == ("notes.txt\nprojects\ntodo.md\n", 0)
    assert ".bashrc" in sh.run("ls -a")[0]
    assert sh.run("cat /etc/hostname") == ("devbox\n", 0)
    assert sh.run("head -n 2 /data/users.csv")[0] == "id,name,email,role\n1,Priya Raman,priya@example.net,admin\n"
    assert sh.run("tail -n 1 /etc/hosts")[0] == "10.0.0.7 cache.internal\n"
    assert sh.run("wc -l /data/sales.csv") == ("9 /data/sales.csv\n", 0)
    assert sh.run("grep -c ERROR /var/log/app.log") == ("2\n", 0)
    assert sh.run("grep -n WARN /var/log/app.log")[0].startswith("3:2025-03-14 09:05:43 WARN")
    assert sh.run("grep -i RENEW todo.md")[0].count("\n") == 2
    assert sh.run("cat /data/sales.csv | grep widget | wc -l") == ("4\n", 0)
    assert sh.run("find / -name '*.csv'") == ("/data/sales.csv\n/data/users.csv\n", 0)
    assert sh.run("cd projects/app") == ("", 0) and sh.run("pwd")[0] == "/home/user/projects/app\n"
    assert sh.run("echo 'a | b'") == ("a | b\n", 0)


def test_errors(sh):
    assert sh.run("cat missing.txt") == ("cat: missing.txt: No such file or directory", 1)
    assert sh.run("cat /data") == ("cat: /data: Is a directory", 1)
    assert sh.run("ls /nope")[0] == "ls: cannot access '/nope': No such file or directory"
    assert sh.run("rm -rf /") == ("bash: rm: command not found", 127)
    assert sh.run("head -n x notes.txt") == ("head: invalid number of lines: 'x'", 1)
    assert sh.run("cd notes.txt")[1] == 1
    assert sh.run("cat 'unterminated")[1] == 2
    assert sh.run("wc -z notes.txt")[1] == 1


@pytest.mark.parametrize(
    "cmd",
    [
        "cat ../../../../etc/passwd",
        "cat /etc/passwd",
        "ls ../../../../../..",
        "cat ~/../../../../proc/self/environ",
        "cat /home/user/../../root/.ssh/id_rsa",
        "python -c 'import os'",
        "sh -c ls",
        "cat $(echo /etc/passwd)",
        "ls; cat /etc/shadow",
    ],
)
def test_no_escape(sh, cmd, monkeypatch):
    import builtins
    import os
    import subprocess

    def forbidden(*a, **k):
        raise AssertionError("the terminal touched the real system")

    monkeypatch.setattr(builtins, "open", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(os, "system", forbidden)
    monkeypatch.setattr(os, "listdir", forbidden)
    out, status = sh.run(cmd)
    assert "root:" not in out and "PATH=" not in out.replace("export PATH=$HOME/bin:$PATH", "")
    if status == 0:  # only paths of the virtual tree can ever be listed
        assert all(line in ("", "data", "etc", "home", "var") for line in out.splitlines())


def test_resolve_stays_inside():
    assert VirtualFS.resolve("/", "../../..") == "/"
    assert VirtualFS.resolve("/home/user", "../../../etc") == "/etc"
    assert VirtualFS.resolve("/a", "//b") == "/b"


def test_env_reset_reward_and_truncation():
    env = TerminalEnv(max_output_chars=50)
    assert env.get_reward() == 0.0
    env.run("cd /data")
    assert env.run("pwd") == "/data\n"
    env.run("cat nothing")
    assert env.get_reward() == pytest.approx(2 / 3)
    assert "[output truncated at 50 characters]" in env.run("cat sales.csv")
    assert env.reset() is None
    assert env.run("pwd") == HOME + "\n" and env.get_reward() == 1.0
    assert FILES["/etc/hostname"] == "devbox\n"  # read-only tree


def test_trl_tool_contract():
    from transformers.utils import get_json_schema

    tools = [
        n
        for n, _ in inspect.getmembers(TerminalEnv, predicate=inspect.isfunction)
        if not n.startswith("_") and n not in ("reset", "get_reward")
    ]
    assert tools == ["run"]
    schema = get_json_schema(TerminalEnv.run)
    assert schema["function"]["parameters"]["required"] == ["command"]


def test_heldout_commands_unseen():
    train = {c for _, cmds in TRAIN_TASKS for c in cmds}
    held = {c for _, cmds in HELDOUT_TASKS for c in cmds}
    assert not train & held
    t = session(*HELDOUT_TASKS[0])
    assert t.completion[1]["role"] == "tool" and t.completion[1]["content"].startswith("2025-03-03")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_online_echo_step(tmp_path):
    """One online ECHO step: TRL generates, runs the terminal tool, and the world term sees env tokens."""
    from examples.terminal.train_online import build, heldout_ce, online, parse_args, warm_start

    args = parse_args(
        [
            "--max_steps",
            "1",
            "--warmup_steps",
            "60",
            "--num_generations",
            "2",
            "--max_completion_length",
            "96",
            "--output_dir",
            str(tmp_path),
        ]
    )
    tokenizer, model, train = build(args)
    warm_start(model, tokenizer, train, args.warmup_steps)
    before = heldout_ce(model, tokenizer)["ce_env"]
    info = online(model, tokenizer, args, 0.05, tmp_path / "echo")
    assert info["env_tokens_trained"] >= 0
    after = heldout_ce(model, tokenizer)["ce_env"]
    assert before > 0 and after > 0
