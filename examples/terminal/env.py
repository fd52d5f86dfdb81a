"""A sandboxed shell-like terminal: a fixed virtual file system and a handful of commands, pure Python.

Nothing here touches the real file system or starts a process: command lines are split with
``shlex`` (no shell), paths are resolved inside an in-memory tree (``..`` stops at ``/``), and each
command is a Python function over that tree. Supported: ``pwd``, ``cd``, ``ls [-a] [-l]``, ``cat``,
``head [-n N]``, ``tail [-n N]``, ``wc [-l|-w|-c]``, ``grep [-i] [-n] [-c] [-v] PATTERN``, ``echo``,
and ``|`` pipelines (stdin for ``cat``, ``head``, ``tail``, ``wc``, ``grep``). Errors read like GNU
coreutils / bash. The tree is read-only (no redirection, no writes), so ``reset`` only restores the
working directory and the command log.

:class:`TerminalEnv` is a TRL ``environment_factory`` class (TRL 1.16 contract): ``reset(**row)`` is
called with the dataset row before each rollout, every other public method is a tool described to
the model from its type hints and Google docstring (here one tool, ``run``), and ``get_reward()``
scores the finished rollout.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import shlex
from dataclasses import dataclass, field

#: The fixed file system: path -> content. Directories are implied by the paths.
FILES: dict[str, str] = {
    "/home/user/notes.txt": (
        "Meeting notes 2025-03-14\n"
        "- ship the billing fix before Friday\n"
        "- Priya owns the release checklist\n"
        "- ask Marcus about the backup schedule\n"
        "- next meeting: Tuesday 10:00\n"
    ),
    "/home/user/todo.md": (
        "# TODO\n"
        "1. renew TLS certificate\n"
        "2. rotate database passwords\n"
        "3. update README with install steps\n"
        "4. archive old logs\n"
        "5. review pull request 42\n"
        "6. renew domain name\n"
    ),
    "/home/user/.bashrc": "export PATH=$HOME/bin:$PATH\nalias ll='ls -l'\n",
    "/home/user/projects/app/main.py": (
        "import sys\n"
        "\n"
        "from app.config import load_config\n"
        "\n"
        "\n"
        "def main(argv):\n"
        "    config = load_config(argv[1])\n"
        "    print(f\"starting {config['name']} on port {config['port']}\")\n"
        "    return 0\n"
        "\n"
        "\n"
        'if __name__ == "__main__":\n'
        "    sys.exit(main(sys.argv))\n"
    ),
    "/home/user/projects/app/config.yaml": "name: inventory\nport: 8080\ndebug: false\nworkers: 4\n",
    "/home/user/projects/app/README.md": (
        "# inventory\n"
        "A small inventory service.\n"
        "Run it with: python main.py config.yaml\n"
        "Port and workers are set in config.yaml.\n"
    ),
    "/data/sales.csv": (
        "date,region,product,units,revenue\n"
        "2025-03-01,north,widget,12,144.00\n"
        "2025-03-01,south,gadget,5,250.00\n"
        "2025-03-02,north,gadget,7,350.00\n"
        "2025-03-02,east,widget,20,240.00\n"
        "2025-03-03,south,widget,9,108.00\n"
        "2025-03-03,west,gizmo,3,297.00\n"
        "2025-03-04,east,gizmo,4,396.00\n"
        "2025-03-04,north,widget,15,180.00\n"
    ),
    "/data/users.csv": (
        "id,name,email,role\n"
        "1,Priya Raman,priya@example.net,admin\n"
        "2,Marcus Oyelaran,marcus@example.net,dev\n"
        "3,Grace Liu,grace@example.org,dev\n"
        "4,Helen Kowalczyk,helen@example.com,ops\n"
        "5,Samuel Adeyemi,samuel@example.org,dev\n"
    ),
    "/var/log/app.log": (
        "2025-03-14 09:00:01 INFO server started on port 8080\n"
        "2025-03-14 09:02:17 INFO GET /items 200\n"
        "2025-03-14 09:05:43 WARN slow query: 1.8s\n"
        "2025-03-14 09:07:12 ERROR database connection lost\n"
        "2025-03-14 09:07:15 INFO reconnected to database\n"
        "2025-03-14 09:15:30 INFO GET /items/42 200\n"
        "2025-03-14 09:21:04 ERROR timeout calling payments\n"
        "2025-03-14 09:30:00 INFO GET /health 200\n"
    ),
    "/etc/hostname": "devbox\n",
    "/etc/hosts": "127.0.0.1 localhost\n10.0.0.5 db.internal\n10.0.0.7 cache.internal\n",
}

HOME = "/home/user"
MAX_OUTPUT_CHARS = 2000


class CommandError(Exception):
    """A command failed: ``str(exc)`` is its stderr line."""


def _dirs(files: dict[str, str]) -> set[str]:
    out = {"/"}
    for path in files:
        d = posixpath.dirname(path)
        while d not in out:
            out.add(d)
            d = posixpath.dirname(d)
    return out


@dataclass
class VirtualFS:
    """A read-only in-memory tree."""

    files: dict[str, str] = field(default_factory=lambda: dict(FILES))

    def __post_init__(self) -> None:
        self.dirs = _dirs(self.files)

    @staticmethod
    def resolve(cwd: str, path: str) -> str:
        """Absolute, normalized path inside the tree (``..`` never climbs above ``/``; ``~`` is home)."""
        if path == "~" or path.startswith("~/"):
            path = HOME + path[1:]
        joined = posixpath.join(cwd, path) if not path.startswith("/") else path
        norm = posixpath.normpath(joined)
        if norm.startswith("//"):
            norm = "/" + norm.lstrip("/")
        return norm

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def is_file(self, path: str) -> bool:
        return path in self.files

    def listdir(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        names = {
            p[len(prefix) :].split("/")[0] for p in [*self.files, *self.dirs] if p.startswith(prefix) and p != path
        }
        return sorted(n for n in names if n)

    def read(self, path: str) -> str:
        return self.files[path]


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _count_opt(args: list[str], cmd: str) -> tuple[int, list[str]]:
    n, rest, i = 10, [], 0
    while i < len(args):
        a = args[i]
        if a == "-n":
            if i + 1 >= len(args):
                raise CommandError(f"{cmd}: option requires an argument -- 'n'")
            val, i = args[i + 1], i + 2
        elif a.startswith("-n"):
            val, i = a[2:], i + 1
        elif re.fullmatch(r"-\d+", a):
            val, i = a[1:], i + 1
        else:
            rest.append(a)
            i += 1
            continue
        if not val.isdigit():
            raise CommandError(f"{cmd}: invalid number of lines: '{val}'")
        n = int(val)
    return n, rest


class Shell:
    """Command interpreter over a :class:`VirtualFS` with a working directory."""

    def __init__(self, fs: VirtualFS | None = None, cwd: str = HOME):
        self.fs = fs or VirtualFS()
        self.cwd = cwd

    # -- plumbing ------------------------------------------------------------------------------
    def _read_inputs(self, cmd: str, paths: list[str], stdin: str | None) -> list[tuple[str, str]]:
        if not paths:
            if stdin is None:
                raise CommandError(f"{cmd}: missing file operand")
            return [("-", stdin)]
        out = []
        for p in paths:
            full = self.fs.resolve(self.cwd, p)
            if self.fs.is_dir(full):
                raise CommandError(f"{cmd}: {p}: Is a directory")
            if not self.fs.is_file(full):
                raise CommandError(f"{cmd}: {p}: No such file or directory")
            out.append((p, self.fs.read(full)))
        return out

    def run(self, line: str) -> tuple[str, int]:
        """``(output, exit status)`` of one command line (stdout, or the error message on failure)."""
        try:
            stages = [shlex.split(part) for part in _split_pipes(line)]
        except ValueError as exc:
            return f"bash: syntax error: {exc}", 2
        if not stages or any(not s for s in stages):
            return ("", 0) if not line.strip() else ("bash: syntax error near unexpected token `|'", 2)
        stdin: str | None = None
        for argv in stages:
            name, args = argv[0], argv[1:]
            fn = getattr(self, f"cmd_{name}", None)
            if fn is None:
                return f"bash: {name}: command not found", 127
            try:
                stdin = fn(args, stdin)
            except CommandError as exc:
                return str(exc), 1
        return stdin or "", 0

    # -- commands ------------------------------------------------------------------------------
    def cmd_pwd(self, args, stdin):
        return self.cwd + "\n"

    def cmd_cd(self, args, stdin):
        target = self.fs.resolve(self.cwd, args[0] if args else HOME)
        if self.fs.is_file(target):
            raise CommandError(f"bash: cd: {args[0]}: Not a directory")
        if not self.fs.is_dir(target):
            raise CommandError(f"bash: cd: {args[0]}: No such file or directory")
        self.cwd = target
        return ""

    def cmd_echo(self, args, stdin):
        return " ".join(args) + "\n"

    def cmd_ls(self, args, stdin):
        flags = {c for a in args if a.startswith("-") for c in a[1:]}
        bad = flags - {"a", "l", "1"}
        if bad:
            raise CommandError(f"ls: invalid option -- '{sorted(bad)[0]}'")
        paths = [a for a in args if not a.startswith("-")] or ["."]
        blocks = []
        for p in paths:
            full = self.fs.resolve(self.cwd, p)
            if self.fs.is_file(full):
                entries = [(p, full)]
            elif self.fs.is_dir(full):
                names = [n for n in self.fs.listdir(full) if "a" in flags or not n.startswith(".")]
                entries = [(n, posixpath.join(full, n)) for n in names]
            else:
                raise CommandError(f"ls: cannot access '{p}': No such file or directory")
            if "l" in flags:
                lines = [
                    f"{'d' if self.fs.is_dir(f) else '-'}rw-r--r-- {len(self.fs.files.get(f, '')):>5} {n}"
                    for n, f in entries
                ]
                body = "\n".join([f"total {len(entries)}", *lines])
            else:
                body = "\n".join(n for n, _ in entries)
            blocks.append((p, body))
        if len(blocks) == 1:
            return blocks[0][1] + ("\n" if blocks[0][1] else "")
        return "\n\n".join(f"{p}:\n{b}" for p, b in blocks) + "\n"

    def cmd_cat(self, args, stdin):
        return "".join(text for _, text in self._read_inputs("cat", args, stdin))

    def cmd_head(self, args, stdin):
        n, paths = _count_opt(args, "head")
        return "".join("".join(_lines(t)[:n]) for _, t in self._read_inputs("head", paths, stdin))

    def cmd_tail(self, args, stdin):
        n, paths = _count_opt(args, "tail")
        return "".join("".join(_lines(t)[-n:] if n else []) for _, t in self._read_inputs("tail", paths, stdin))

    def cmd_wc(self, args, stdin):
        flags = {c for a in args if a.startswith("-") for c in a[1:]}
        bad = flags - {"l", "w", "c"}
        if bad:
            raise CommandError(f"wc: invalid option -- '{sorted(bad)[0]}'")
        paths = [a for a in args if not a.startswith("-")]
        shown = [k for k in "lwc" if k in flags] or ["l", "w", "c"]
        rows = []
        for name, text in self._read_inputs("wc", paths, stdin):
            counts = {"l": text.count("\n"), "w": len(text.split()), "c": len(text.encode())}
            cols = " ".join(str(counts[k]) for k in shown)
            rows.append(cols if name == "-" else f"{cols} {name}")
        return "\n".join(rows) + "\n"

    def cmd_grep(self, args, stdin):
        flags, rest = set(), []
        for a in args:
            if a.startswith("-") and len(a) > 1 and not rest:
                flags |= set(a[1:])
            else:
                rest.append(a)
        bad = flags - {"i", "n", "c", "v"}
        if bad:
            raise CommandError(f"grep: invalid option -- '{sorted(bad)[0]}'")
        if not rest:
            raise CommandError("Usage: grep [OPTION]... PATTERNS [FILE]...")
        pattern, paths = rest[0], rest[1:]
        try:
            rx = re.compile(pattern, re.IGNORECASE if "i" in flags else 0)
        except re.error:
            rx = re.compile(re.escape(pattern), re.IGNORECASE if "i" in flags else 0)
        inputs = self._read_inputs("grep", paths, stdin)
        out, matched = [], False
        for name, text in inputs:
            hits = [(k, ln) for k, ln in enumerate(_lines(text), 1) if bool(rx.search(ln)) != ("v" in flags)]
            matched |= bool(hits)
            prefix = f"{name}:" if len(inputs) > 1 else ""
            if "c" in flags:
                out.append(f"{prefix}{len(hits)}\n")
                continue
            for k, ln in hits:
                out.append(f"{prefix}{f'{k}:' if 'n' in flags else ''}{ln if ln.endswith(chr(10)) else ln + chr(10)}")
        if not matched and "c" not in flags:
            return ""
        return "".join(out)

    def cmd_find(self, args, stdin):
        root = args[0] if args and not args[0].startswith("-") else "."
        pattern = args[args.index("-name") + 1] if "-name" in args and args.index("-name") + 1 < len(args) else "*"
        full = self.fs.resolve(self.cwd, root)
        if not (self.fs.is_dir(full) or self.fs.is_file(full)):
            raise CommandError(f"find: '{root}': No such file or directory")
        found = sorted(
            p
            for p in [*self.fs.files, *self.fs.dirs]
            if (p == full or p.startswith(full.rstrip("/") + "/")) and fnmatch.fnmatch(posixpath.basename(p), pattern)
        )
        shown = [root.rstrip("/") + p[len(full.rstrip("/")) :] if root != "/" else p for p in found]
        return "\n".join(shown) + ("\n" if shown else "")


def _split_pipes(line: str) -> list[str]:
    """Split on ``|`` outside quotes."""
    parts, cur, quote = [], [], None
    for ch in line:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur.append(ch)
        elif ch == "|":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


class TerminalEnv:
    """TRL ``environment_factory`` class: one sandboxed terminal per rollout (tool: ``run``)."""

    def __init__(self, max_output_chars: int = MAX_OUTPUT_CHARS):
        self._fs = VirtualFS()
        self._max = max_output_chars
        self._shell = Shell(self._fs)
        self._log: list[tuple[str, int]] = []

    def reset(self, **kwargs) -> str | None:
        """Fresh terminal in the home directory (the tree is read-only); nothing is added to the prompt."""
        self._shell = Shell(self._fs)
        self._log = []
        return None

    def run(self, command: str) -> str:
        """
        Run a command line in the sandboxed terminal and return what it prints.

        Args:
            command: The command line, e.g. "ls -l /data" or "grep -n ERROR /var/log/app.log | head -n 3".
                Available commands: pwd, cd, ls, cat, head, tail, wc, grep, find, echo; pipes with |.

        Returns:
            The command's output (or its error message).
        """
        out, status = self._shell.run(str(command))
        self._log.append((str(command), status))
        if len(out) > self._max:
            out = out[: self._max] + f"\n[output truncated at {self._max} characters]"
        return out

    def get_reward(self) -> float:
        """Fraction of this rollout's commands that succeeded (0 when it ran none)."""
        if not self._log:
            return 0.0
        return sum(status == 0 for _, status in self._log) / len(self._log)
