"""The one command-line convention (``echo_trl.command_line``): ``--config`` on every command, switches before
positional arguments, the checks of ``__post_init__`` as one-line usage errors, and the demo's options that are
``EchoGRPOConfig``'s fields."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from echo_trl.command_line import CommandParser, non_negative_number, positive_int, positive_number
from echo_trl.commands import build_dataset, eval_world_model, stats
from echo_trl.commands.capture import command as capture
from echo_trl.commands.cli import COMMANDS, main
from echo_trl.errors import EchoTrlError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PACKAGE = Path(__file__).resolve().parents[2] / "echo_trl"


def usage_error(capsys, parse, argv) -> str:
    """The one line ``parse(argv)`` answers a usage error with (exit 2)."""
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    return err.rstrip("\n")


def test_config_yaml_sets_flags_and_positional_arguments_and_the_command_line_wins(tmp_path):
    recipe = tmp_path / "stats.yaml"
    recipe.write_text("dataset: runs/ds\ntokenizer: tok\nmax_length: 512\njson: true\nsplit: test\n")
    dataset, args = stats.parse_args(["--config", str(recipe), "--max_length", "64"])
    assert (dataset, args.tokenizer, args.max_length, args.json, args.split) == ("runs/ds", "tok", 64, True, "test")
    recipe.write_text("inputs: [a.jsonl, b]\noutput: out\nformat: awm-agent\n")
    inputs, args = build_dataset.parse_args(["--config", str(recipe)])
    assert inputs == ["a.jsonl", "b"] and args.output == "out" and args.format == "awm-agent"
    recipe.write_text("model: m\ndataset: d\nlimit: 3\n")
    assert eval_world_model.parse_args(["--config", str(recipe)]).limit == 3


def test_config_yaml_mistakes_are_one_line(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("tokenizer: tok\nmax_lenght: 512\n")
    assert usage_error(capsys, stats.parse_args, ["ds", "--config", str(recipe)]) == (
        f"echo-trl stats: error: --config {recipe}: no flag named max_lenght (`echo-trl stats --help` lists the flags)"
    )
    recipe.write_text("tokenizer: tok\nmax_length: [512]\n")
    with pytest.raises(
        EchoTrlError, match=re.escape(f"--config {recipe}: max_length: expected an integer, got [512]")
    ):
        stats.parse_args(["ds", "--config", str(recipe)])
    recipe.write_text("model: m\ndataset: d\njson: {a: 1}\n")
    with pytest.raises(EchoTrlError, match="json: expected true or false"):
        eval_world_model.parse_args(["--config", str(recipe)])
    recipe.write_text("model: m\ndataset: d\nmax_rendered_chars: 0\n")  # the same check as on the command line
    assert "argument --max_rendered_chars: expected a positive integer, got '0'" in usage_error(
        capsys, eval_world_model.parse_args, ["--config", str(recipe)]
    )
    # through the console script's main: one line, exit 2, for a file that is not there or not a mapping
    assert main(["stats", "ds", "--tokenizer", "t", "--config", str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err == f"echo-trl stats: error: --config {tmp_path / 'none.yaml'}: no such file\n"
    recipe.write_text("- a list\n")
    assert main(["build-dataset", "x", "--config", str(recipe)]) == 2
    assert "expected a mapping of flag names to values, got list" in capsys.readouterr().err


def test_a_switch_takes_a_truth_value_or_none_and_never_swallows_a_positional(capsys):
    inputs, args = build_dataset.parse_args(["--skip-invalid", "a", "b", "--private", "-o", "out"])
    assert inputs == ["a", "b"] and args.skip_invalid and args.private
    inputs, args = build_dataset.parse_args(["a", "--skip_invalid", "false", "--private=yes", "-o", "out"])
    assert inputs == ["a"] and not args.skip_invalid and args.private
    dataset, args = stats.parse_args(["--json", "ds", "--tokenizer", "t"])
    assert dataset == "ds" and args.json
    err = usage_error(capsys, eval_world_model.parse_args, ["--model", "m", "--dataset", "d", "--json", "stray"])
    assert err.startswith("echo-trl eval-world-model: error: unrecognized arguments: stray (")


def test_post_init_checks_keep_the_messages_of_the_old_type_functions(capsys):
    for value in ("0", "-3"):
        err = usage_error(capsys, stats.parse_args, ["ds", "--tokenizer", "t", "--max_rendered_chars", value])
        assert err == (
            f"echo-trl stats: error: argument --max_rendered_chars: expected a positive integer, got '{value}' "
            "(`echo-trl stats --help` lists the flags)"
        )
    err = usage_error(capsys, build_dataset.parse_args, ["a", "-o", "o", "--format", "awm-agent", "--compact_tools"])
    assert "--compact-tools applies to --format chat-template" in err
    with pytest.raises(ValueError, match="expected a positive integer"):  # the same check for Python callers
        stats.StatsArguments(tokenizer="t", max_rendered_chars=0)
    for bad in (0, -1.5, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="expected a finite number > 0"):
            positive_number("tool_timeout", bad)
    for bad in (-1, float("nan"), float("-inf")):
        with pytest.raises(ValueError, match="expected a finite number >= 0"):
            non_negative_number("wait", bad)
    positive_number("tool_timeout", 0.5)
    non_negative_number("wait", 0)
    positive_int("n", 1)
    with pytest.raises(ValueError, match="got '2.0'"):
        positive_int("n", 2.0)


def test_no_argparse_internals_and_every_command_parses_dataclasses():
    """The convention uses argparse's public API only, and no sub-command keeps a parser of its own."""
    private = re.compile(r"_option_string_actions|\._actions\b|\._(parse_optional|get_values|get_option_tuples)\b")
    offenders = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if private.search(path.read_text())}
    assert not offenders, offenders
    own_parser = re.compile(r"class \w+\((argparse\.)?ArgumentParser\)|ArgumentParser\(")
    offenders = {path.name for path in (PACKAGE / "commands").glob("*.py") if own_parser.search(path.read_text())}
    assert not offenders, offenders
    for name, (module, _) in COMMANDS.items():
        if name not in ("train", "sft"):  # TRL's own configs, parsed in training_run
            parser = importlib.import_module(module).make_parser()
            assert isinstance(parser, CommandParser) and parser.dataclass_types, name
    assert capture.make_parser().dataclass_types == [capture.CaptureArguments]


# --- capture: repeatable flags and --config ----------------------------------------------------------------------


def test_capture_config_yaml_sets_every_kind_of_flag_and_the_command_line_wins(tmp_path, capsys):
    recipe = tmp_path / "capture.yaml"
    recipe.write_text(
        "data: scenarios\nscenario: [library_1, library_2]\ntask_idx: [0, 4]\npolicy: replay:s.jsonl\n"
        "output: out\nmax_steps: 3\ntool_timeout: 2.5\nstop_on_format_error: true\nformat: awm-agent\n"
    )
    args = capture.parse_args(["--config", str(recipe)])
    assert (args.data, args.scenario, args.task_idx, args.policy, args.output) == (
        "scenarios",
        ["library_1", "library_2"],
        [0, 4],
        "replay:s.jsonl",
        "out",
    )
    assert (args.max_steps, args.tool_timeout, args.stop_on_format_error) == (3, 2.5, True)
    assert (args.format, args.verify_turn) == ("awm-agent", "omit")  # the default that follows the format
    # the command line replaces a list the file gave (it does not extend it), and overrides a value
    args = capture.parse_args(["--config", str(recipe), "--scenario", "x", "--task-idx", "7", "--max_steps", "5"])
    assert (args.scenario, args.task_idx, args.max_steps) == (["x"], [7], 5)
    recipe.write_text("data: d\nscenario: library_1\ntask_idx: '3'\npolicy: replay:s\noutput: o\n")
    args = capture.parse_args(["--config", str(recipe)])  # one value of a repeatable flag is a list of one
    assert (args.scenario, args.task_idx) == (["library_1"], [3])
    # the checks of the command line hold for values from the file
    recipe.write_text("data: d\nhub: true\nscenario: [s]\npolicy: replay:s\noutput: o\n")
    assert "argument --hub: not allowed with argument --data" in usage_error(
        capsys, capture.parse_args, ["--config", str(recipe)]
    )
    recipe.write_text("data: d\nscenario: [s]\npolicy: replay:s\noutput: o\nverifier_timeout: -1\n")
    assert "argument --verifier_timeout: expected a finite number > 0, got '-1'" in usage_error(
        capsys, capture.parse_args, ["--config", str(recipe)]
    )
    recipe.write_text("data: d\nscenario: [s]\npolicy: replay:s\noutput: o\ntask_idx: [1.5]\n")
    with pytest.raises(EchoTrlError, match=r"task_idx: expected a list of integers, got \[1\.5\]"):
        capture.parse_args(["--config", str(recipe)])
    recipe.write_text("data: d\nscenario: [s]\npolicy: replay:s\noutput: o\ntask_idx: ['1', x]\n")
    assert "argument --task_idx: invalid int value in ['1', 'x']" in usage_error(
        capsys, capture.parse_args, ["--config", str(recipe)]
    )


# --- the demo's options: EchoGRPOConfig's fields -------------------------------------------------------------


def test_demo_options_are_the_configs_fields_and_reach_both_runs(tmp_path, capsys):
    from echo_trl.config import BEHAVIOR_POLICIES, EchoGRPOConfig
    from echo_trl.demo.options import RUN_OPTIONS, DemoArguments, parse_demo_args

    config_fields = {f.name: f for f in dataclasses.fields(EchoGRPOConfig)}
    demo_fields = {f.name: f for f in dataclasses.fields(DemoArguments)}
    assert set(RUN_OPTIONS) <= set(demo_fields)
    for name in ("world_model_coeff", "behavior_policy"):  # the demo keeps the config's default and help
        assert demo_fields[name].default == config_fields[name].default
        assert demo_fields[name].metadata["help"] == config_fields[name].metadata["help"]
    # every option that is a config field reaches the run's config, whatever its value
    changed = {
        "world_model_coeff": "0.075",
        "behavior_policy": next(p for p in BEHAVIOR_POLICIES if p != demo_fields["behavior_policy"].default),
        "max_steps": "7",
        "learning_rate": "0.25",
        "per_device_train_batch_size": "6",
        "eval_steps": "3",
        "max_completion_length": "99",
        "seed": "11",
    }
    assert set(changed) == set(RUN_OPTIONS)
    options = parse_demo_args([f"--{k.replace('_', '-')}={v}" for k, v in changed.items()])
    run = options.run_config(tmp_path / "echo", world_model_coeff=options.world_model_coeff)
    for name, text in changed.items():
        assert getattr(run, name) == type(getattr(run, name))(text), name
    assert run.output_dir == str(tmp_path / "echo") and run.use_cpu
    baseline = options.run_config(tmp_path / "grpo", world_model_coeff=0.0)
    assert baseline.world_model_coeff == 0.0 and baseline.learning_rate == 0.25
    # the warm-up is the demo's own (the config's warmup_steps is the learning-rate warm-up, 0 in both runs)
    assert options.warmup_settings().steps == demo_fields["warmup_steps"].default and run.warmup_steps == 0
    err = usage_error(capsys, parse_demo_args, ["--behavior_policy", "recorded"])
    assert all(repr(p) in err for p in BEHAVIOR_POLICIES)
