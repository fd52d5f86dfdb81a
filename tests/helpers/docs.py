"""The documents' code blocks (``<!-- docs-test: ... -->`` markers, see tests/project/test_docs.py) and how a
user's shell runs them: in a fresh directory, with the Hub reachable in principle and every attempt counted, the
``echo-trl`` / ``python`` lines in this process (each fresh interpreter costs seconds of imports) and one line
through the installed console script."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.hub import CountingEndpoint

REPO = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"(?:<!-- docs-test: (run|check)\b([^>]*?)-->\n)?```(\w*)\n(.*?)^```", re.S | re.M)
_LONG_JOBS = ("echo-trl train", "echo-trl sft", "python examples/")


@dataclass
class Block:
    doc: str
    line: int
    mode: str | None  # run | check | None (unmarked)
    extra: str  # run: arguments appended to long jobs; check: the reason
    lang: str
    code: str

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: str) -> list[Block]:
    text = (REPO / doc).read_text(encoding="utf-8")
    return [
        Block(doc, text.count("\n", 0, m.start(3)) + 1, m.group(1), (m.group(2) or "").strip(), m.group(3), m.group(4))
        for m in _BLOCK.finditer(text)
    ]


def logical_lines(code: str) -> list[str]:
    """Shell lines with ``\\`` continuations joined and comment-only lines dropped."""
    return [
        line for line in code.replace("\\\n", " ").splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def with_overrides(code: str, extra: str) -> str:
    out = []
    for line in logical_lines(code):
        if extra and line.lstrip().startswith(_LONG_JOBS):
            argv = shlex.split(line, comments=True)
            if argv == ["echo-trl", "train"]:  # the demo: with options it is `echo-trl train --demo OPTIONS`
                argv.append("--demo")
            line = shlex.join(argv) + " " + extra
        out.append(line)
    return "\n".join(out) + "\n"


#: The one line that runs through the installed ``echo-trl`` console script in a fresh interpreter (the entry
#: point itself, and the Hub stand-in below, exercised for real); every other line runs in this process.
CONSOLE_SCRIPT_LINE = ("README.md", "echo-trl stats ")
#: The README's demo line (with its overrides, ``echo-trl train --demo ...``): run once, by
#: tests/demo/test_demo.py::test_the_readme_demo_end_to_end, which also checks what it wrote.
README_DEMO = ("README.md", "echo-trl train --demo")
_SHELL_OPERATORS = frozenset("|&;<>()`$")


def _link_data(work: Path, episodes_per_task: int | None) -> None:
    """``data/`` of the document's directory: the repository's, or (``episodes_per_task``) the same with each
    bundled episode file of ``data/episodes`` cut to its first ``episodes_per_task`` episodes (lines), every
    task still there: the documents' commands, as written, on a smaller input."""
    if episodes_per_task is None:
        (work / "data").symlink_to(REPO / "data")
        return
    (work / "data").mkdir()
    for entry in (REPO / "data").iterdir():
        if entry.name != "episodes":
            (work / "data" / entry.name).symlink_to(entry)
    episodes = work / "data" / "episodes"
    episodes.mkdir()
    for entry in (REPO / "data" / "episodes").iterdir():
        if entry.suffix == ".jsonl":
            lines = entry.read_text(encoding="utf-8").splitlines(keepends=True)
            (episodes / entry.name).write_text("".join(lines[:episodes_per_task]), encoding="utf-8")
        else:
            (episodes / entry.name).symlink_to(entry)


def _workdir(tmp_path: Path, cache: Path | None, episodes_per_task: int | None) -> tuple[Path, dict[str, str]]:
    """The document's directory (``data/`` and ``examples/`` linked in, see :func:`_link_data`) and the
    environment a user's shell has there: ``echo-trl`` of this checkout first on ``PATH``, an echo_trl cache of
    its own (``cache``: one shared with other documents, so what one computed the others load, as a user's
    second command does), the Hub not switched off."""
    work = tmp_path / "clone"
    work.mkdir()
    _link_data(work, episodes_per_task)
    (work / "examples").symlink_to(REPO / "examples")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "echo-trl"  # the console script of this checkout
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m echo_trl.commands.cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        ECHO_TRL_CACHE=str(cache or tmp_path / "cache"),
        ECHO_TRL_PROGRESS="0",
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_DISABLE_TELEMETRY="1",
    )  # see CountingEndpoint.env
    return work, env


class NetworkGuard:
    """The in-process counterpart of :class:`CountingEndpoint`: the Hub switched back on (as a user's shell has
    it: not offline, telemetry off as ``HF_HUB_DISABLE_TELEMETRY=1`` does) and every connection this process
    tries beyond the loopback counted and refused, as a Hub that cannot be reached. Loopback stays open: the
    commands talk to their own local servers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        import socket

        import datasets.config
        import huggingface_hub.constants

        self.count, self.attempts = 0, []
        for module, name, value in (
            (huggingface_hub.constants, "HF_HUB_OFFLINE", False),
            (huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True),
            (datasets.config, "HF_HUB_OFFLINE", False),
            (datasets.config, "HF_DATASETS_OFFLINE", False),
        ):
            monkeypatch.setattr(module, name, value)
        loopback = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}
        original_getaddrinfo, original_connect = socket.getaddrinfo, socket.socket.connect
        original_connect_ex = socket.socket.connect_ex

        def refused(what):
            self.count += 1
            self.attempts.append(what)
            return what

        def getaddrinfo(host, *args, **kwargs):
            if host is not None and (host.decode() if isinstance(host, bytes) else str(host)) not in loopback:
                raise socket.gaierror(socket.EAI_NONAME, f"no network in the docs test: {refused(host)}")
            return original_getaddrinfo(host, *args, **kwargs)

        def outside(sock, address) -> bool:
            return sock.family in (socket.AF_INET, socket.AF_INET6) and str(address[0]) not in loopback

        def connect(sock, address):
            if outside(sock, address):
                raise ConnectionRefusedError(f"no network in the docs test: {refused(address)}")
            return original_connect(sock, address)

        def connect_ex(sock, address):
            if outside(sock, address):
                refused(address)
                return errno.ECONNREFUSED
            return original_connect_ex(sock, address)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket.socket, "connect", connect)
        monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


def cli_in_process(argv, monkeypatch, capsys, **env) -> tuple[int, str, str, NetworkGuard]:
    """``echo-trl ARGV`` in this process as in a user's shell: the Hub switched on but unreachable (every
    connection beyond the loopback counted and refused by the guard), ``env`` set: its exit code, stdout,
    stderr and the guard."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    guard = NetworkGuard(monkeypatch)
    if env.get("HF_HUB_OFFLINE"):  # the libraries read it once, at import: set where a fresh process has it
        import datasets.config
        import huggingface_hub.constants

        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    from echo_trl.commands.cli import main

    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err, guard


@contextlib.contextmanager
def user_shell(tmp_path: Path, *, cache: Path | None = None, episodes_per_task: int | None = None):
    """This process set up as a user's shell in the document's directory, and put back afterwards: cwd, the
    environment, ``sys.argv`` / ``sys.path``, torch's threads, the Hub guarded; generated AWM code contained the
    way a user's run contains it (this suite's opt-out for hosts without bwrap undone: the docs promise
    bubblewrap). ``cache`` and ``episodes_per_task``: see :func:`_workdir`. Yields ``(directory, environment,
    hub, guard)``: the two counters of Hub attempts."""
    import torch

    from echo_trl.sandbox import bwrap as sandbox

    work, env = _workdir(tmp_path, cache, episodes_per_task)
    hub = CountingEndpoint()  # HF_ENDPOINT, read when called: echo_trl's own probe, and the console-script run
    env["HF_ENDPOINT"] = hub.url
    saved_env, threads = dict(os.environ), torch.get_num_threads()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(work)
        monkeypatch.setattr(sys, "argv", list(sys.argv))
        monkeypatch.setattr(sys, "path", list(sys.path))
        contained = getattr(sandbox.require_containment, "__wrapped__", sandbox.require_containment)
        monkeypatch.setattr(sandbox, "require_containment", contained)
        os.environ.clear()
        os.environ.update(env)
        guard = NetworkGuard(monkeypatch)  # the libraries' endpoint, fixed when they were imported
        try:
            yield work, env, hub, guard
        finally:
            hub.close()
            os.environ.clear()
            os.environ.update(saved_env)
            torch.set_num_threads(threads)


def _simple_command(line: str, where: str) -> list[str]:
    """``line`` as argv, refusing what only a shell could run (pipes, redirections, ``$``, ``cd`` / ``export``
    that would have to carry over to later lines): such a line belongs in a shell-only command."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>()")
    lexer.whitespace_split, lexer.commenters = True, "#"
    argv = list(lexer)
    operators = [t for t in argv if set(t) <= _SHELL_OPERATORS] + [t for t in argv if "$" in t or "`" in t]
    assert not operators and argv[0] not in ("cd", "export", "source", "."), (
        f"{where}: the docs runner runs echo-trl / python lines in-process and takes simple commands only: {line}"
    )
    return argv


def _exit_code(run) -> int:
    try:
        return int(run() or 0)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (what the suite's budget counts)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def is_console_script_line(block: Block, line: str) -> bool:
    return block.doc == CONSOLE_SCRIPT_LINE[0] and line.startswith(CONSOLE_SCRIPT_LINE[1])


def run_line(block: Block, line: str, work: Path, env: dict[str, str], capsys) -> str:
    """One logical line of a ``run`` block, as the user's shell in ``work`` runs it; asserts it succeeded and
    returns its standard output."""
    import runpy

    from echo_trl.commands.cli import main as cli_main

    first = shlex.split(line, comments=True)[:1]
    console = is_console_script_line(block, line)
    if first not in (["echo-trl"], ["python"]) or console:  # the shell's own lines, and the one real entry point
        cmd = ["bash", "-c", "set -euo pipefail\n" + line]
        if console:
            cmd = [str(Path(sys.executable).parent / "echo-trl"), *shlex.split(line, comments=True)[1:]]
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{block.where()} failed: {line}\n{proc.stderr[-3000:]}"
        return proc.stdout
    argv = _simple_command(line, block.where())
    if argv[0] == "echo-trl":
        code = _exit_code(lambda: cli_main(argv[1:]))
    elif argv[1] == "-c":
        sys.path.insert(0, "")
        code = _exit_code(lambda: exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__"}))
    else:  # python SCRIPT ARGS: the script's folder first on the path, as the interpreter puts it
        script = work / argv[1]
        assert script.is_file(), f"{block.where()}: {argv[1]} does not exist"
        sys.path.insert(0, str(script.parent))
        sys.argv = [str(script), *argv[2:]]
        code = _exit_code(lambda: runpy.run_path(str(script), run_name="__main__"))
    out = capsys.readouterr()
    assert code == 0, f"{block.where()} failed (exit {code}): {line}\n{out.err[-3000:]}"
    return out.out


def readme_demo() -> tuple[Block, str]:
    """The README's demo line (:data:`README_DEMO`) with its overrides, and its block."""
    found = [
        (block, line)
        for block in blocks(README_DEMO[0])
        if block.mode == "run" and block.lang != "python"
        for line in logical_lines(with_overrides(block.code, block.extra))
        if line.startswith(README_DEMO[1])
    ]
    assert len(found) == 1, f"{README_DEMO}: expected one such run line, found {len(found)}"
    return found[0]


def run_python_block(block: Block, work: Path, capsys) -> None:
    sys.path.insert(0, str(work))  # python _snippet.py in the document's directory
    exec(compile(block.code, block.where(), "exec"), {"__name__": "__main__"})
    capsys.readouterr()
