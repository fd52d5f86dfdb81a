"""The docs work as written: every command and snippet of README.md and docs/ runs offline on CPU, and every
link and file name in them points at something that exists.

Each ```bash / ```python block of the checked documents carries a marker comment right above it:

* ``<!-- docs-test: run -->``: run as written, block after block in one fresh directory per document
  (``data/`` and ``examples/`` linked in, ``echo-trl`` from this checkout, no network: ``HF_ENDPOINT``
  points at a stand-in that counts connections, any other connection is counted and refused, and the test
  asserts that nothing asked). The ``echo-trl`` and ``python`` lines and snippets run in this process, as the
  command's ``main(argv)`` / the script, in the document's directory and environment (helpers/docs.py); one
  line runs through the installed console script (``CONSOLE_SCRIPT_LINE``), and the README's demo line runs in
  tests/demo/test_demo.py, which checks what it wrote;
* ``<!-- docs-test: run ARGS -->``: the same with ``ARGS`` appended to each ``echo-trl train`` /
  ``echo-trl sft`` / ``python examples/...`` line (a long job cut to ``--max_steps 1``-style size; the block
  says which; the demo, ``echo-trl train`` alone, becomes ``echo-trl train --demo ARGS``);

In the test the documents read a smaller ``data/episodes`` (:data:`EPISODES_PER_TASK` of each bundled task
file) and share one echo_trl cache (``docs_cache``), so what a command computes once (the token cache, the
starting model's log-probs) a later one loads, as on a user's machine.
* ``<!-- docs-test: check REASON -->``: needs what a test does not have (the Hub, a GPU, the network for
  ``pip``, or it is this test suite): ``bash -n`` / ``compile`` only, plus every ``echo-trl`` command's
  flags parsed by that command's own parser (files it names must exist).

An unmarked block fails the test, so a new block is classified when it is written. ``docs/api.md`` holds
generated signatures (compared with the docstrings below) and ``text`` blocks are output: neither is run.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers.docs import (
    CONSOLE_SCRIPT_LINE,
    README_DEMO,
    REPO,
    Block,
    blocks,
    cpu_seconds,
    is_console_script_line,
    logical_lines,
    run_line,
    run_python_block,
    user_shell,
    with_overrides,
)

CHECKED_DOCS = (
    "README.md",
    "docs/datasets.md",
    "docs/training.md",
    "docs/concepts.md",
    "docs/reliability.md",
    "docs/prefix_sharing.md",
    "docs/benchmarks.md",
    "docs/real_model.md",
)
#: Hand-written documents whose links and file names must resolve (docs/api.md is generated).
LINKED_DOCS = (*CHECKED_DOCS, "CHANGELOG.md", "data/README.md", "examples/terminal/README.md")


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
    if cmd == "sft" and rest[:1] == ["--compare"]:  # the two-stage comparison: its own options
        from echo_trl.demo.two_stage import parse_args

        try:
            parse_args(rest[1:])
            return []
        except SystemExit:
            return [f"(argparse rejected {shlex.join(rest)})"]
    from echo_trl.commands.cli import COMMANDS

    mod = importlib.import_module(COMMANDS[cmd][0])  # the module the dispatcher runs for CMD
    try:
        if hasattr(mod, "build_parser"):
            return mod.build_parser().parse_known_args(rest)[1]
        if not hasattr(mod, "parse_args"):  # a TrlParser command without its own parse_args
            return mod.make_parser().parse_known_args(rest)[1]
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
# run: as a user runs them, in a fresh directory; the Python in this process


#: The bundled episodes the documents' commands read in the test: each task's first 3 of 6 (rewards 1, 1, 0:
#: every group still has an advantage), every task kept. What a command costs grows with the episodes (the
#: token cache, the starting model's log-probs, stats) and what it checks does not; the demo
#: (tests/demo/test_demo.py) and tests/envs/awm/test_bundled_episodes.py read all 60.
EPISODES_PER_TASK = 3


@pytest.fixture(scope="session")
def docs_cache(tmp_path_factory):
    """One echo_trl cache for every document's run, as one user's machine has: the documents build the same
    dataset for the same tiny model, and a later document loads the token cache and starting-model log-probs an
    earlier one computed (the computing path runs in the first; tests/tokens and tests/train check both)."""
    return tmp_path_factory.mktemp("docs-echo-cache")


@pytest.fixture
def as_a_user(tmp_path, docs_cache):
    with user_shell(tmp_path, cache=docs_cache, episodes_per_task=EPISODES_PER_TASK) as shell:
        yield shell


def test_the_hub_stand_ins_count_what_would_reach_the_hub(as_a_user):
    """The positive control of the check below: a Hub lookup from this process, as a user's shell runs it, is
    counted (the libraries' offline switches are off) and refused; echo_trl's own probe meets the endpoint."""
    from huggingface_hub import model_info

    from echo_trl.data.hub import locate
    from echo_trl.errors import EchoTrlError

    _, _, hub, guard = as_a_user
    with pytest.raises(Exception):  # noqa: B017 - whichever error the library makes of a Hub that hangs up
        model_info("echo-trl-tests/no-such-model")
    assert hub.count + guard.count == 1  # asked once: the library's offline switch is off in this process
    with pytest.raises(EchoTrlError, match="unreachable"):
        locate("echo-trl-tests/no-such-dataset", "--dataset_name")
    assert hub.count + guard.count == 2


def run_lines(doc: str) -> list[tuple[Block, str | None]]:
    """The document's ``run`` blocks as the runner takes them: each shell line with its overrides, or a whole
    Python block (``None``)."""
    return [
        (block, line)
        for block in blocks(doc)
        if block.mode == "run"
        for line in ([None] if block.lang == "python" else logical_lines(with_overrides(block.code, block.extra)))
    ]


def test_the_lines_run_elsewhere_are_in_the_readme():
    lines = [line for block, line in run_lines("README.md") if line]
    assert sum(line.startswith(CONSOLE_SCRIPT_LINE[1]) for line in lines) >= 1, (
        f"no README line starts with {CONSOLE_SCRIPT_LINE[1]!r}: choose another line to run as the console script"
    )
    assert sum(line.startswith(README_DEMO[1]) for line in lines) == 1, "the README's demo line (test_demo.py)"


def test_run_blocks_write_only_under_outputs():
    """A user follows the docs from a clone: what a block writes (``--output``, ``--output_dir``, ``-o``, a shell
    redirection) goes under ``outputs/``, never into the repository's root."""
    import re

    written = [
        (block.where(), path)
        for doc in CHECKED_DOCS
        for block, line in run_lines(doc)
        if line
        for path in re.findall(r"(?:--output(?:_dir)?|-o|>)[ =]+(\S+)", line)
    ]
    assert written and not [(where, path) for where, path in written if not path.startswith("outputs/")]


@pytest.mark.slow
@pytest.mark.sandbox  # capture and the online example run the AWM servers in bubblewrap
@pytest.mark.timeout(1800)  # a document's blocks together: several short trainings on a shared 2-core machine
@pytest.mark.parametrize("doc", [d for d in CHECKED_DOCS if any(b.mode == "run" for b in blocks(d))])
def test_run_blocks_run_offline_on_cpu(doc, as_a_user, capsys):
    work, env, hub, guard = as_a_user
    costs, console = [], 0
    for block, line in run_lines(doc):
        if doc == README_DEMO[0] and line and line.startswith(README_DEMO[1]):
            continue  # run and checked by tests/demo/test_demo.py::test_the_readme_demo_end_to_end
        start = cpu_seconds()
        if line is None:
            run_python_block(block, work, capsys)
        else:
            console += is_console_script_line(block, line)
            run_line(block, line, work, env, capsys)
        costs.append(f"{cpu_seconds() - start:7.1f}  {block.where()}  {(line or '(python)').strip()[:100]}")
    print(f"data/episodes: each task's first {EPISODES_PER_TASK} episodes", "CPU s  line", *costs, sep="\n")
    assert console == (doc == CONSOLE_SCRIPT_LINE[0])  # the one console-script run is in there
    assert hub.count == 0, f"{doc}: the commands contacted the Hub endpoint {hub.count} times"
    assert guard.count == 0, f"{doc}: the commands tried the network {guard.count} times: {guard.attempts[:5]}"


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
