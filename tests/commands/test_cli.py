"""The ``echo-trl`` dispatcher and the data-path commands, run as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.docs import cli_in_process
from helpers.episodes import openenv_episode
from helpers.processes import unprivileged
from helpers.shared_data import AWM1K_SAMPLES, require_shared

from echo_trl.commands.cli import COMMANDS, main


def run_cli(*args, cwd=None, prefix=()):
    return subprocess.run(
        [*prefix, sys.executable, "-m", "echo_trl.commands.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**__import__("os").environ, "ECHO_TRL_PROGRESS": "0"},
    )


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS) and "Exit codes" in out
    assert main(["frobnicate"]) == 2


def test_package_and_help_start_without_torch_or_trl_and_every_public_name_resolves():
    """``import echo_trl`` and ``echo-trl --help`` stay fast (heavy libraries load on first use of a name)."""
    probe = (
        "import sys, echo_trl; from echo_trl.commands.cli import main; main(['--help']); "
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'datasets') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout + proc.stderr
    import echo_trl

    for name in echo_trl.__all__:
        obj = getattr(echo_trl, name)  # imports the module that defines it
        assert not callable(obj) or obj.__name__ == name, name
    assert set(echo_trl.__all__) <= set(dir(echo_trl))


def test_build_dataset_lenient_then_stats_json(tmp_path, monkeypatch, capsys):
    from echo_trl.demo.tiny import build_tiny_tokenizer

    def run(*argv):
        code, out, err, guard = cli_in_process(argv, monkeypatch, capsys)
        assert guard.count == 0, guard.attempts
        return code, out, err

    eps = tmp_path / "eps.jsonl"
    eps.write_text(
        "\n".join([json.dumps(openenv_episode()), '{"scenario": 1}', json.dumps(openenv_episode(task_idx=3))]) + "\n"
    )
    code, _, err = run("build-dataset", eps, "--output", tmp_path / "ds")
    assert code == 2 and "Traceback" not in err
    assert "eps.jsonl:2: scenario: expected a string, got an integer" in err

    code, out, err = run("build-dataset", eps, "--output", tmp_path / "ds", "--skip-invalid")
    assert code == 0, err
    assert "built 2 episodes" in out and "skipped 1 invalid record" in err
    (report,) = [json.loads(line) for line in (tmp_path / "ds" / "skipped.jsonl").read_text().splitlines()]
    assert report["record"] == "2" and report["raw"] == {"scenario": 1}

    build_tiny_tokenizer("qwen3").save_pretrained(tmp_path / "tok")
    code, out, err = run("stats", tmp_path / "ds", "--tokenizer", tmp_path / "tok", "--json")
    assert code == 0, err
    result = json.loads(out)  # stdout holds exactly one JSON object
    assert result["episodes"] == 2 and set(result["tokens"]) == {"context", "action", "env_output", "warning"}
    assert result["tokens"]["warning"] > 0  # the fixture carries a harness warning


def test_missing_tokenizer_is_a_clean_error(tmp_path, monkeypatch, capsys):
    eps = tmp_path / "e.json"
    eps.write_text(json.dumps(openenv_episode()))
    (tmp_path / "empty").mkdir()  # a directory that holds no tokenizer
    code, _, err, _ = cli_in_process(["stats", eps, "--tokenizer", tmp_path / "empty"], monkeypatch, capsys)
    assert code == 2 and "cannot load tokenizer" in err and "Traceback" not in err
    assert err.count("\n") == 1


def _capture_args(tmp_path, output):
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"task_idx": 0, "calls": []}) + "\n")
    return [
        "capture",
        "--data",
        str(require_shared(AWM1K_SAMPLES)),
        "--scenario",
        "content_platform_1",
        "--policy",
        f"replay:{replay}",
        "--output",
        str(output),
    ]


def test_unusable_output_is_one_line_exit_2_for_build_and_capture(tmp_path, capsys):
    eps = tmp_path / "e.json"
    eps.write_text(json.dumps(openenv_episode()))
    afile = tmp_path / "afile"
    afile.write_text("keep")
    for output, message in [
        (afile, f"--output {afile}: is a file, not a directory"),
        (afile / "ds", f"--output {afile / 'ds'}: is under {afile}, which is not a directory"),
    ]:
        for args in (["build-dataset", str(eps), "--output", str(output)], _capture_args(tmp_path, output)):
            assert main(args) == 2
            err = capsys.readouterr().err
            assert err == f"echo-trl {args[0]}: error: {message}\n"
    assert afile.read_text() == "keep"


def test_read_only_output_is_one_line_exit_2_for_build_and_capture(tmp_path):
    prefix = unprivileged()
    eps = tmp_path / "e.json"
    eps.write_text(json.dumps(openenv_episode()))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        build = run_cli("build-dataset", eps, "--output", ro / "ds", prefix=prefix)
        capture = run_cli(*_capture_args(tmp_path, ro / "cap"), prefix=prefix)
    finally:
        ro.chmod(0o755)
    assert (build.returncode, build.stderr) == (
        2,
        f"echo-trl build-dataset: error: --output {ro / 'ds'}: cannot write in {ro} (Permission denied)\n",
    )
    assert (capture.returncode, capture.stderr) == (
        2,
        f"echo-trl capture: error: --output {ro / 'cap'}: cannot create it (Permission denied)\n",
    )
    assert list(ro.iterdir()) == []


def test_inputs_lost_silently_before_are_named(tmp_path):
    prefix = unprivileged()
    root = tmp_path / "eps"
    (root / "locked").mkdir(parents=True)
    (root / "UPPER.JSON").write_text(json.dumps(openenv_episode(task_idx=4)))
    (root / "locked" / "hidden.json").write_text(json.dumps(openenv_episode(task_idx=5)))
    (root / "locked").chmod(0)
    try:
        strict = run_cli("build-dataset", root, "--output", tmp_path / "ds", prefix=prefix)
        lenient = run_cli("build-dataset", root, "--output", tmp_path / "ds", "--skip-invalid", prefix=prefix)
    finally:
        (root / "locked").chmod(0o755)
    assert strict.returncode == 2 and strict.stderr == (
        f"echo-trl build-dataset: error: {root / 'locked'}: cannot read directory: Permission denied\n"
    )
    assert lenient.returncode == 0 and "built 1 episode from" in lenient.stdout
    assert f"{root / 'locked'}: cannot read directory: Permission denied" in lenient.stderr
    (tmp_path / "empty").mkdir()
    empty = run_cli("build-dataset", tmp_path / "empty", "--output", tmp_path / "ds2", "--skip-invalid")
    assert empty.returncode == 2 and "Traceback" not in empty.stderr and len(empty.stderr.splitlines()) == 1
    assert "no episode files (.json, .jsonl) in this directory" in empty.stderr
    assert not (tmp_path / "ds2").exists()


def test_build_dataset_formats_and_verify_turn_then_show(tmp_path, capsys):
    from pathlib import Path

    from echo_trl.data.store import load_echo_dataset
    from echo_trl.demo.tiny import build_tiny_tokenizer

    episodes = Path(__file__).resolve().parents[2] / "data" / "episodes" / "library_1_task0.jsonl"
    assert main(["build-dataset", str(episodes), "--output", str(tmp_path / "agent"), "--format", "awm-agent"]) == 0
    assert "format awm-agent" in capsys.readouterr().out
    assert (
        main(
            [
                "build-dataset",
                str(episodes),
                "--output",
                str(tmp_path / "agent_v"),
                "--format",
                "awm-agent",
                "--verify-turn",
                "env_output",
            ]
        )
        == 0
    )
    assert main(["build-dataset", str(episodes), "--output", str(tmp_path / "plain")]) == 0
    agent, agent_v, plain = (load_echo_dataset(tmp_path / n) for n in ("agent", "agent_v", "plain"))
    assert set(agent["format"]) == {"awm-agent"} and set(plain["format"]) == {"chat-template"}
    verified = [
        any(s["action"]["tool_name"] == "verify" for s in json.loads(line)["steps"])
        for line in episodes.read_text().splitlines()
    ]
    assert 0 < sum(verified) < len(verified)  # the file has both kinds
    assert [len(r["completion"]) + v for r, v in zip(agent, verified, strict=True)] == [
        len(r["completion"]) for r in agent_v
    ]
    assert [r["completion"][-1]["name"] == "verify" for r in agent_v] == verified

    build_tiny_tokenizer("qwen3").save_pretrained(tmp_path / "tok")
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "agent"), "--tokenizer", str(tmp_path / "tok"), "--show", "0"]) == 0
    shown = capsys.readouterr().out
    assert "Available MCP Tools (21 tools):" in shown and "mcp_tool_" in shown

    bad = run_cli("build-dataset", episodes, "--output", tmp_path / "x", "--format", "openai")
    assert bad.returncode == 2 and "invalid choice: 'openai'" in bad.stderr
    with pytest.raises(SystemExit) as exit_:
        main(["build-dataset", str(episodes), "-o", str(tmp_path / "y"), "--format", "awm-agent", "--compact-tools"])
    assert exit_.value.code == 2 and "--compact-tools applies to --format chat-template" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()


# --------------------------------------------------------------------------------------------
# Usage conventions shared by every command


def test_help_into_a_closed_pipe_is_not_a_traceback():
    """`echo-trl --help | head -3`: the reader may leave before the help is written."""
    import os

    for argv in (["--help"], ["stats", "--help"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "echo_trl.commands.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        proc.stdout.close()  # the reader is gone before anything is written
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_flags_use_underscores_accept_hyphens_and_are_never_abbreviated(capsys):
    from echo_trl.commands import build_dataset, eval_world_model, stats
    from echo_trl.commands.capture import command as capture

    assert (
        "--max_length" in stats.make_parser().format_help()
        and "--trust_remote_code" in stats.make_parser().format_help()
    )
    for spelling in ("--max_length", "--max-length"):
        assert stats.parse_args(["ds", "--tokenizer", "t", spelling, "8"])[1].max_length == 8
    # a bare switch in front of the positional argument stays a switch
    dataset, args = stats.parse_args(["--json", "ds", "--tokenizer", "t", "--max-length=9", "--trust-remote-code"])
    assert dataset == "ds" and args.json and args.trust_remote_code and args.max_length == 9
    for abbreviated in (["--max_len", "8"], ["--trust"], ["--tok", "t"]):
        with pytest.raises(SystemExit) as exc:
            stats.parse_args(["ds", "--tokenizer", "t", *abbreviated])
        assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        err[0]
        == "echo-trl stats: error: unrecognized arguments: --max_len 8 (`echo-trl stats --help` lists the flags)"
    )
    assert len(err) == 3  # one line per refusal
    ns = eval_world_model.parse_args(
        ["--model", "m", "--dataset", "d", "--max-completion-length", "7", "--trust-remote-code"]
    )
    assert ns.max_completion_length == 7 and ns.trust_remote_code
    with pytest.raises(SystemExit):
        eval_world_model.parse_args(["--model", "m", "--dataset", "d", "--lim", "3"])
    # flags defined with underscores take both spellings
    inputs, ns = build_dataset.parse_args(
        ["eps", "--output", "o", "--skip_invalid", "--compact-tools", "--push_to_hub", "me/x"]
    )
    assert inputs == ["eps"] and ns.skip_invalid and ns.compact_tools and ns.push_to_hub == "me/x"
    with pytest.raises(SystemExit):
        build_dataset.parse_args(["eps", "--output", "o", "--skip"])
    # capture: both spellings; its repeatable flags take one value each time, in order
    assert "--task_idx" in capture.make_parser().format_help()
    ns = capture.parse_args(
        ["--data", "d", "--scenario", "s", "--policy", "replay:p", "--output", "o", "--task_idx", "1"]
        + ["--task-idx", "2", "--max_steps", "3", "--scenario-file", "f", "--scenario", "t"]
    )
    assert ns.task_idx == [1, 2] and ns.max_steps == 3 and ns.scenario == ["s", "t"] and ns.scenario_file == "f"
    for refused in (["--scenario", "a", "b"], ["--max_step", "3"], ["--all"]):
        with pytest.raises(SystemExit):
            capture.parse_args(["--data", "d", "--policy", "replay:p", "--output", "o", "--scenario", "s", *refused])


# --------------------------------------------------------------------------------------------
# Local paths never go to the Hub; Hub ids fail fast without network


def test_missing_local_paths_are_one_line_errors_without_asking_the_hub(tmp_path, monkeypatch, capsys):
    from echo_trl.demo.tiny import build_tiny_tokenizer

    build_tiny_tokenizer("qwen3").save_pretrained(tmp_path / "tok")
    eps = tmp_path / "e.json"
    eps.write_text(json.dumps(openenv_episode()))
    cases = [
        (["stats", tmp_path / "no_ds", "--tokenizer", tmp_path / "tok"], f"dataset {tmp_path / 'no_ds'}"),
        (["stats", eps, "--tokenizer", "./no_tok"], "tokenizer ./no_tok"),
        (["eval-world-model", "--model", tmp_path / "no_model", "--dataset", eps], f"model {tmp_path / 'no_model'}"),
        (
            [
                "train",
                "--model_name_or_path",
                tmp_path / "no_model",
                "--dataset_name",
                tmp_path,
                "--use_cpu",
                "--output_dir",
                tmp_path / "o",
            ],
            f"--model_name_or_path {tmp_path / 'no_model'}",
        ),
    ]
    for argv, named in cases:
        code, out, err, guard = cli_in_process(argv, monkeypatch, capsys)
        assert code == 2, err
        assert err.count("\n") == 1 and f"{named}: no such file or directory" in err, err
        assert guard.count == 0, guard.attempts  # not one request for a local path


def test_hub_id_without_network_fails_at_once_naming_hf_hub_offline(tmp_path, monkeypatch, capsys):
    from echo_trl.demo.tiny import build_tiny_tokenizer

    build_tiny_tokenizer("qwen3").save_pretrained(tmp_path / "tok")
    argv = ["stats", "someone/awm-echo", "--tokenizer", tmp_path / "tok"]
    code, out, err, guard = cli_in_process(argv, monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "dataset someone/awm-echo: no such file or directory" in err and "HF_HUB_OFFLINE=1" in err
    assert guard.count == 1, guard.attempts  # one probe, no library retries (they took ~30 s before)
    code, out, err, guard = cli_in_process(argv, monkeypatch, capsys, HF_HUB_OFFLINE="1")
    assert code == 2 and "not in the local Hub cache (HF_HUB_OFFLINE is set" in err, err
    assert guard.count == 0, guard.attempts  # offline: the Hub is not asked at all


def test_build_dataset_shows_no_progress_bar_for_a_small_save(tmp_path):
    eps = tmp_path / "eps.jsonl"
    eps.write_text(json.dumps(openenv_episode()) + "\n")
    r = subprocess.run(
        [sys.executable, "-m", "echo_trl.commands.cli", "build-dataset", str(eps), "--output", str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "Saving the dataset" not in r.stderr and r.stderr == "", r.stderr


def test_quiet_defaults_drop_deepspeeds_cpu_notice_and_keep_its_other_warnings():
    """DeepSpeed's logger ("DeepSpeed", its handler on stdout) says "Setting accelerator to CPU ..." on every CPU
    run, into `--json` output; the filter set before DeepSpeed configures the logger drops that line only."""
    import logging

    from echo_trl.commands.cli import quiet_defaults

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger = logging.getLogger("DeepSpeed")
    handler = Keep()
    logger.addHandler(handler)
    try:
        quiet_defaults()
        logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it")
        logger.warning("ZeRO-3 needs a larger bucket")
    finally:
        logger.removeHandler(handler)
    assert seen == ["ZeRO-3 needs a larger bucket"]
