"""Misuse of every command ends in one ``echo-trl CMD: error: ...`` line and exit 2, never a traceback.

Damaged datasets, swapped model / dataset paths, impossible numbers and an unreachable Hub, each as a user
meets them; then a property over generated flag combinations of every sub-command.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import signal
import subprocess
import sys

import pytest
from helpers.episodes import openenv_episode
from helpers.hub import CountingEndpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_trl.commands.cli import COMMANDS, main

LIBRARY = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "awm_scenarios"
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny model, a saved trajectory dataset, and damaged copies of it."""
    import shutil

    from echo_trl.data.build import build_awm_dataset
    from echo_trl.demo.tiny import ensure_tiny_model

    root = tmp_path_factory.mktemp("misuse")
    episodes = root / "eps.jsonl"
    episodes.write_text("".join(json.dumps(openenv_episode(task_idx=i)) + "\n" for i in range(4)))
    build_awm_dataset([episodes]).save_to_disk(str(root / "ds"))
    model = ensure_tiny_model(root / "model", family="qwen3", vocab_size=600, hidden_size=32)
    shutil.copytree(root / "ds", root / "truncated_arrow")
    (arrow,) = (root / "truncated_arrow").glob("*.arrow")
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    shutil.copytree(root / "ds", root / "bad_info")
    (root / "bad_info" / "dataset_info.json").write_text('{"features": ', encoding="utf-8")
    (root / "a_file").write_text("not a directory\n", encoding="utf-8")
    return root, model, episodes


def run_in_process(argv: list[str], capsys) -> tuple[int, str]:
    """``echo-trl ARGV`` through the CLI's own ``main`` (an argparse exit is a ``SystemExit``): (code, stderr)."""
    sigterm = signal.getsignal(signal.SIGTERM)  # capture installs its own handler
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    return code, capsys.readouterr().err


def assert_one_line(code: int, err: str, command: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"echo-trl {command}: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def train_flags(model, dataset, output, *extra) -> list[str]:
    return [
        "train",
        *("--model_name_or_path", str(model), "--dataset_name", str(dataset), "--output_dir", str(output)),
        *("--max_steps", "1", "--per_device_train_batch_size", "2", "--num_generations", "2", "--use_cpu"),
        *("--report_to", "none", "--save_strategy", "no", "--max_completion_length", "1024"),
        *("--gradient_checkpointing", "false", "--disable_tqdm", "true", *extra),
    ]


def test_push_to_hub_without_network_keeps_the_local_save(assets, tmp_path):
    root, _, episodes = assets
    hub = CountingEndpoint()  # a Hub that hangs up on every connection
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "echo_trl.commands.cli", "build-dataset", str(episodes)]
            + ["--output", str(tmp_path / "out"), "--push_to_hub", "me/awm-echo"],
            capture_output=True,
            text=True,
            env=hub.env(),
            timeout=120,
        )
    finally:
        hub.close()
    assert_one_line(proc.returncode, proc.stderr, "build-dataset", "me/awm-echo", str(tmp_path / "out"), "kept")
    from echo_trl.data.store import load_echo_dataset

    assert len(load_echo_dataset(tmp_path / "out")) == 4  # the local save stayed, whole


@pytest.mark.parametrize("command", ["stats", "eval-world-model", "train"])
def test_a_truncated_arrow_file_is_named(assets, command, tmp_path, capsys):
    root, model, _ = assets
    bad = root / "truncated_arrow"
    argv = {
        "stats": ["stats", str(bad), "--tokenizer", str(model)],
        "eval-world-model": ["eval-world-model", "--model", str(model), "--dataset", str(bad)],
        "train": train_flags(model, bad, tmp_path / "out"),
    }[command]
    code, err = run_in_process(argv, capsys)
    (arrow,) = bad.glob("*.arrow")
    assert_one_line(code, err, command, str(bad), arrow.name, "damaged")


def test_a_damaged_dataset_info_is_named(assets, capsys):
    root, model, _ = assets
    code, err = run_in_process(["stats", str(root / "bad_info"), "--tokenizer", str(model)], capsys)
    assert_one_line(code, err, "stats", "dataset_info.json", "damaged")


def test_eval_world_model_on_a_model_directory_as_dataset(assets, capsys):
    _, model, _ = assets
    code, err = run_in_process(["eval-world-model", "--model", str(model), "--dataset", str(model)], capsys)
    assert_one_line(code, err, "eval-world-model", f"dataset {model}", "model directory")


def test_train_with_a_batch_size_of_zero(assets, tmp_path, capsys):
    root, model, _ = assets
    argv = train_flags(model, root / "ds", tmp_path / "out", "--per_device_train_batch_size", "0")
    code, err = run_in_process(argv, capsys)
    assert_one_line(code, err, "train", "per_device_train_batch_size", ">= 1")


def test_train_with_output_dir_a_file(assets, capsys):
    root, model, _ = assets
    code, err = run_in_process(train_flags(model, root / "ds", root / "a_file"), capsys)
    assert_one_line(code, err, "train", "--output_dir", str(root / "a_file"), "is a file")
    assert (root / "a_file").read_text() == "not a directory\n"


def test_train_with_a_dataset_as_the_model(assets, tmp_path, capsys):
    root, _, _ = assets
    code, err = run_in_process(train_flags(root / "ds", root / "ds", tmp_path / "out"), capsys)
    assert_one_line(code, err, "train", "--model_name_or_path", str(root / "ds"), "not a model directory")


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--tool_timeout", "-1"),
        ("--verifier_timeout", "nan"),
        ("--temperature", "nan"),
        ("--temperature", "-1"),
        ("--top_p", "inf"),
        ("--top_p", "0"),
        ("--max_retries", "-1"),
        ("--max_response_bytes", "0"),
        ("--max_rendered_chars", "-5"),
    ],
)
def test_capture_refuses_impossible_timeouts(tmp_path, flag, value, capsys):
    data = tmp_path / "data"
    data.mkdir()
    argv = ["capture", "--data", str(data), "--scenario", "s", "--policy", "replay:x.jsonl"]
    argv += ["--output", str(tmp_path / "out"), flag, value]
    code, err = run_in_process(argv, capsys)
    assert_one_line(code, err, "capture", flag, repr(value))
    assert not (tmp_path / "out").exists()  # refused before any work


# --- the property: generated flag combinations, every sub-command ------------------------------------------------

#: Values that break naive parsing: empty, zero, negative, non-finite, huge, words, paths of every kind.
BAD_VALUES = ["", "0", "-1", "1", "nan", "inf", "-inf", "1e999", "abc", "true", "/nonexistent/x", "{a_file}", "{dir}"]
MISSING = "/nonexistent/echo-trl-misuse"


@functools.cache
def _options(command: str) -> list[tuple[str, bool]]:
    """(flag, takes a value) of every long option of ``command``: one per field of its dataclasses (a switch takes
    an optional value), plus the ``--no_`` complement of a switch that defaults to true."""
    module = importlib.import_module(COMMANDS[command][0])
    out = []
    for dtype in module.make_parser().dataclass_types:
        for f in dataclasses.fields(dtype):
            if f.init and not (command in TRAINING and f"--{f.name}" in TRAIN_SKIPPED):
                out.append((f"--{f.name}", True))
                if f.default is True:
                    out.append((f"--no_{f.name}", False))
    return out


#: The commands whose parser is TRL's (every TrainingArguments flag).
TRAINING = {"train", "sft"}

#: TRL / transformers flags that load or contact something outside the process (a config file, an
#: accelerator, a tracker) before any echo-trl code runs; their validation is theirs.
TRAIN_SKIPPED = {"--deepspeed", "--fsdp", "--fsdp_config", "--accelerator_config", "--config", "--push_to_hub"}

#: Positional / required arguments that make every generated run stop at a missing path, before any model loads.
REQUIRED = {
    "build-dataset": [MISSING, "--output", "{dir}/out"],
    "stats": [MISSING, "--tokenizer", MISSING],
    "eval-world-model": ["--model", MISSING, "--dataset", MISSING],
    "capture": ["--data", MISSING, "--scenario", "s", "--policy", f"replay:{MISSING}", "--output", "{dir}/out"],
    "check-scenarios": [MISSING, "--output", "{dir}/out"],
    "train": ["--model_name_or_path", MISSING, "--dataset_name", MISSING, "--output_dir", "{dir}/out", "--use_cpu"],
    "sft": ["--model_name_or_path", MISSING, "--dataset_name", MISSING, "--output_dir", "{dir}/out", "--use_cpu"],
    "materialize-model": ["--model", MISSING, "--output_dir", "{dir}/out"],  # never a real (minutes-long) write
}


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(sorted(COMMANDS)))
    options = _options(command)
    argv = [command, *REQUIRED[command]]
    for flag, takes_value in draw(st.lists(st.sampled_from(options), min_size=1, max_size=4)):
        argv.append(flag)
        if takes_value:
            argv.append(draw(st.sampled_from(BAD_VALUES)))
    return argv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=command_lines())
def test_no_flag_combination_prints_a_traceback(argv, tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("flags")
    (root / "a_file").write_text("x\n")
    argv = [a.replace("{a_file}", str(root / "a_file")).replace("{dir}", str(root)) for a in argv]
    code, err = run_in_process(argv, capsys)
    assert code in (0, 2) and "Traceback" not in err, (argv, err)
    if code == 2:
        assert err.strip().splitlines()[-1].startswith(f"echo-trl {argv[0]}: error: "), (argv, err)


# --- the property against a hostile inference server: whatever it sends, one line or a strict-JSON collection ------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    from helpers.hostile_server import ANSWER, HostileServer
    from helpers.tiny import tiny_tokenizer

    tok = tmp_path_factory.mktemp("tok")
    tiny_tokenizer("qwen2_5").save_pretrained(tok)
    with HostileServer(tiny_tokenizer("qwen2_5").encode(ANSWER + "<|im_end|>", add_special_tokens=False)) as srv:
        yield srv, tok


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    modes=st.lists(
        st.sampled_from(sorted(__import__("helpers.hostile_server").hostile_server.MODES)), min_size=1, max_size=3
    )
)
def test_capture_against_any_hostile_server_mode_is_one_line_or_strict_json(modes, hostile, tmp_path_factory, capsys):
    from echo_trl.data.readers.episode_files import iter_episode_records

    server, tok = hostile
    out = tmp_path_factory.mktemp("hostile") / "out"
    argv = ["capture", "--data", str(LIBRARY), "--scenario", "library_1", "--task_idx", "0", "--episodes", "2"]
    argv += ["--policy", f"openai:{server.url('+'.join(modes))}", "--model", "m", "--tokenizer", str(tok)]
    argv += ["--max_steps", "2", "--request_timeout", "2", "--max_retries", "1", "--retry_backoff", "0"]
    argv += ["--max_response_bytes", str(4 << 20), "--output", str(out)]
    code, err = run_in_process(argv, capsys)
    assert code in (0, 2) and "Traceback" not in err, (modes, err)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("echo-trl capture: error: "), (modes, err)
    for rec in iter_episode_records(sorted(out.glob("*_task*.jsonl"))):  # the library's own strict reader
        assert rec.error is None, (modes, rec.error)
