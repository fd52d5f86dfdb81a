"""echo_trl.help_pages: the stored ``--help`` pages are exactly what their parsers render, and printing one loads
neither TRL nor torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from echo_trl import help_pages


@pytest.mark.parametrize("name", sorted(help_pages.PAGES))
def test_each_stored_page_is_its_parser_rendered_now(name):
    assert help_pages.page(name) == help_pages.rendered(name), (
        f"echo_trl/help/{name}.txt is stale: run `python -m echo_trl.help_pages` after changing a flag"
    )


def test_the_short_training_pages_list_echo_first_and_count_the_rest():
    import dataclasses

    from trl import ModelConfig

    from echo_trl.commands.support.training_run import EchoScriptArguments
    from echo_trl.config import EchoGRPOConfig

    text = help_pages.page("train")
    flag = lambda name: text.index(f"\n  --{name} ")  # noqa: E731 (a flag's own line, not the usage line)
    assert flag("world_model_coeff") < flag("max_steps") < flag("model_name_or_path")
    configs = (EchoScriptArguments, EchoGRPOConfig, ModelConfig)
    every = {f.name for c in configs for f in dataclasses.fields(c) if f.init}
    listed = {name for name in every if f"  --{name} " in text or f"  --{name}\n" in text}
    assert set(help_pages.own_fields(EchoGRPOConfig)) <= listed
    assert f"{len(every) - len(listed)} more flags" in text.splitlines()[-1]


def test_help_pages_print_without_trl_or_torch():
    code = (
        "import sys; from echo_trl.commands.cli import main\n"
        "for argv in (['train', '--help'], ['train', '--demo', '--help'], ['sft', '--help']):\n"
        "    assert main(argv) == 0\n"
        "heavy = [m for m in ('trl', 'torch', 'transformers', 'datasets') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: echo-trl train --demo" in done.stdout and "ECHO flags (EchoSFTConfig)" in done.stdout


def test_wants_help_stops_at_the_separator():
    assert help_pages.wants_help(["--max_steps", "1", "-h"])
    assert not help_pages.wants_help(["--", "--help"]) and not help_pages.wants_help(["--help-all"])
