"""echo_trl.progress: bars only where someone watches; scripts that print one table silence the libraries."""

from __future__ import annotations

import logging
import os
import warnings

import pytest

from echo_trl.progress import progress, quiet_libraries


def test_progress_is_silent_off_a_terminal_and_yields_everything(capsys):
    assert list(progress(range(5), desc="work")) == [0, 1, 2, 3, 4]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("keep", [False, True])
def test_quiet_libraries_drops_deprecations_and_keeps_what_is_asked(monkeypatch, keep):
    monkeypatch.delenv("ECHO_TRL_PROGRESS", raising=False)
    logger = logging.getLogger("echo_trl")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_libraries(progress_bars=keep, user_warnings=keep)
        warnings.warn("old", FutureWarning, stacklevel=1)
        warnings.warn("heads up", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == (["heads up"] if keep else [])
    assert logger.level == logging.ERROR
    assert (os.environ.get("ECHO_TRL_PROGRESS") == "0") is not keep


@pytest.mark.parametrize(("setting", "shown"), [("1", True), ("0", False), ("", False)])
def test_the_environment_variable_shows_or_hides_bars_off_a_terminal(monkeypatch, capsys, setting, shown):
    monkeypatch.setenv("ECHO_TRL_PROGRESS", setting)
    assert list(progress(range(3), desc="work", unit="ep")) == [0, 1, 2]
    err = capsys.readouterr().err  # pytest's stderr is not a terminal: "" falls back to hidden
    assert ("work: 100%" in err and "3/3" in err) is shown


def test_training_progress_counts_optimizer_steps_and_shows_the_last_heldout_ce(capsys):
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from echo_trl.progress import training_progress

    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    state.max_steps = 4
    bar = training_progress("train echo", enable=True)
    bar.on_train_begin(args, state, control)
    for step in range(1, 5):
        state.global_step = step
        bar.on_step_end(args, state, control)
        if step == 2:
            bar.on_evaluate(args, state, control, metrics={"eval_world/ce_env": 1.23456, "eval_loss": 9.0})
    bar.on_train_end(args, state, control)
    err = capsys.readouterr().err
    assert "train echo: 100%" in err and "4/4" in err and "ce_env=1.235" in err and "eval_loss" not in err
