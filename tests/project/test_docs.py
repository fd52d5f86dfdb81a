"""The docs work as written: every command and snippet of README.md and docs/ runs offline on CPU, and every
link and file name in them points at something that exists.

Each ```bash / ```python block of the checked documents carries a marker comment right above it:

* ``<!-- docs-test: run -->``: run as written, block after block in one fresh directory per document
  (``data/`` and ``examples/`` linked in, ``echo-trl`` from this checkout, no network: ``HF_ENDPOINT``
  points at a stand-in that counts connections, and the test asserts that nothing asked it);
* ``<!-- docs-test: run ARGS -->``: the same with ``ARGS`` appended to each ``echo-trl train`` /
  ``python examples/...`` line (a long job cut to ``--max_steps 1``-style size; the block says which;
  the demo, ``echo-trl train`` alone, becomes ``echo-trl train --demo ARGS``);
* ``<!-- docs-test: check REASON -->``: needs what a test does not have (the Hub, a GPU, the network for
  ``pip``, or it is this test suite): ``bash -n`` / ``compile`` only, plus every ``echo-trl`` command's
  flags parsed by that command's own parser (files it names must exist).

An unmarked block fails the test, so a new block is classified when it is written. ``docs/api.md`` holds
generated signatures (compared with the docstrings below) and ``text`` blocks are output: neither is run.
"""

from __future__ import annotations

import importlib.util
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
CHECKED_DOCS = (
    "README.md",
    "docs/datasets.md",
    "docs/training.md",
    "docs/concepts.md",
    "docs/reliability.md",
    "docs/prefix_sharing.md",
    "docs/benchmarks.md",
)
#: Hand-written documents whose links and file names must resolve (docs/api.md is generated).
LINKED_DOCS = (*CHECKED_DOCS, "CHANGELOG.md", "data/README.md", "examples/terminal/README.md")
_BLOCK = re.compile(r"(?:<!-- docs-test: (run|check)\b([^>]*?)-->\n)?```(\w*)\n(.*?)^```", re.S | re.M)
_LONG_JOBS = ("echo-trl train", "python examples/")


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


def test_every_code_block_is_marked():
    unmarked = [
        b.where()
        for doc in CHECKED_DOCS
        for b in blocks(doc)
        if b.lang in ("bash", "python", "sh", "") and b.mode is None
    ]
    assert not unmarked, f"code blocks without a <!-- docs-test: run|check --> marker: {unmarked}"
    assert sum(b.mode == "run" for b in blocks("README.md")) >= 4


# --------------------------------------------------------------------------------------------
# check: flags parsed by each command's own parser


def _train_flags(argv: list[str]) -> list[str]:
    from echo_trl.commands.train import make_parser

    if "--config" in argv:
        i = argv.index("--config")
        assert (REPO / argv[i + 1]).is_file(), argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    if argv[:1] == ["--demo"]:  # the demo's own options
        from echo_trl.demo.run import parse_demo_args

        try:
            parse_demo_args(argv[1:])
        except SystemExit:
            return [f"(the demo's parser rejected {shlex.join(argv[1:])})"]
        return []
    if not argv:
        return []
    return make_parser().parse_known_args(argv)[1]


def unknown_flags(argv: list[str]) -> list[str]:
    """Flags of ``echo-trl CMD ...`` that CMD's parser does not take (an argparse error counts as one)."""
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return _train_flags(rest)
    module = {
        "stats": "stats",
        "build-dataset": "build_dataset",
        "capture": "capture",
        "check-scenarios": "check_scenarios",
        "eval-world-model": "eval_world_model",
    }[cmd]
    mod = importlib.import_module(f"echo_trl.commands.{module}")
    try:
        if hasattr(mod, "build_parser"):
            return mod.build_parser().parse_known_args(rest)[1]
        mod.parse_args(rest)
        return []
    except SystemExit:
        return [f"(argparse rejected {shlex.join(rest)})"]


def check_block(block: Block) -> None:
    if block.lang == "python":
        compile(block.code, block.where(), "exec")
        return
    subprocess.run(["bash", "-n"], input=block.code, text=True, check=True)
    for line in logical_lines(block.code):
        argv = shlex.split(line, comments=True)
        if argv[:1] == ["echo-trl"]:
            assert not unknown_flags(argv[1:]), (block.where(), line, unknown_flags(argv[1:]))
        elif "echo_trl.commands.cli" in argv:
            assert not unknown_flags(argv[argv.index("echo_trl.commands.cli") + 1 :]), (block.where(), line)
        if argv[:1] == ["accelerate"] and "--config_file" in argv:
            assert (REPO / argv[argv.index("--config_file") + 1]).is_file(), line
        if argv[:2] and argv[0] == "python" and argv[1].endswith(".py"):
            assert (REPO / argv[1]).is_file(), line


@pytest.mark.parametrize("doc", CHECKED_DOCS)
def test_check_blocks_parse(doc):
    for block in blocks(doc):
        if block.mode == "check":
            check_block(block)


# --------------------------------------------------------------------------------------------
# run: as a user runs them, in a fresh directory


def _workdir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("data", "examples"):
        (work / name).symlink_to(REPO / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "echo-trl"  # the console script of this checkout
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m echo_trl.commands.cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        ECHO_TRL_CACHE=str(tmp_path / "cache"),
        ECHO_TRL_PROGRESS="0",
        CUDA_VISIBLE_DEVICES="",
        HF_HUB_DISABLE_TELEMETRY="1",
    )  # see CountingEndpoint.env
    return work, env


def run_block(block: Block, work: Path, env: dict[str, str]) -> None:
    if block.lang == "python":
        script = work / f"_snippet_{block.line}.py"
        script.write_text(block.code, encoding="utf-8")
        cmd = [sys.executable, str(script)]
    else:
        script = work / f"_block_{block.line}.sh"
        script.write_text("set -euo pipefail\n" + with_overrides(block.code, block.extra), encoding="utf-8")
        cmd = ["bash", str(script)]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{block.where()} failed:\n{script.read_text()}\n{proc.stderr[-3000:]}"


@pytest.mark.timeout(1800)  # a document's blocks together: several short trainings on a shared 2-core machine
@pytest.mark.parametrize("doc", [d for d in CHECKED_DOCS if any(b.mode == "run" for b in blocks(d))])
def test_run_blocks_run_offline_on_cpu(doc, tmp_path):
    work, env = _workdir(tmp_path)
    hub = CountingEndpoint()
    env["HF_ENDPOINT"] = hub.url
    try:
        for block in blocks(doc):
            if block.mode == "run":
                run_block(block, work, env)
    finally:
        hub.close()
    assert hub.count == 0, f"{doc}: the commands contacted the Hub {hub.count} times"


# --------------------------------------------------------------------------------------------
# generated reference and file names


def test_api_reference_is_up_to_date():
    spec = importlib.util.spec_from_file_location("make_api", REPO / "docs" / "make_api.py")
    make_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_api)
    assert (REPO / "docs" / "api.md").read_text(encoding="utf-8") == make_api.render(), (
        "docs/api.md is out of date: run python docs/make_api.py"
    )


_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FILE_NAME = re.compile(
    r"(?<![\w./-])((?:examples|docs|data|benchmarks|tests|echo_trl)/[\w./-]*\w\.(?:yaml|py|md|jsonl|json|png))(?!\w)"
)


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    return {github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_github_anchor():
    assert github_anchor("Prefix sharing, whole trainer step: `prefix_sharing --trainer`") == (
        "prefix-sharing-whole-trainer-step-prefix_sharing---trainer"
    )
    assert github_anchor("ECHO's cost: `echo_overhead`") == "echos-cost-echo_overhead"


@pytest.mark.parametrize("doc", LINKED_DOCS)
def test_relative_links_resolve(doc):
    """Every relative link (and image) leads to a file of this repository, and its #anchor to a heading there."""
    path = REPO / doc
    broken = []
    for target in _LINK.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists() or (anchor and (not dest.is_file() or anchor not in anchors(dest))):
            broken.append(target)
    assert not broken, f"{doc}: broken links {broken}"


def test_file_names_are_found():
    text = "see `docs/api.md`, ../shared/data/x.json, data/a.jsonl and tests/test_envs_awm_*.py."
    assert _FILE_NAME.findall(text) == ["docs/api.md", "data/a.jsonl"]


@pytest.mark.parametrize("doc", LINKED_DOCS)
def test_docs_name_only_files_that_exist(doc):
    paths = set(_FILE_NAME.findall((REPO / doc).read_text(encoding="utf-8")))
    missing = [p for p in sorted(paths) if not (REPO / p).exists()]
    assert not missing, f"{doc} names files that do not exist: {missing}"
