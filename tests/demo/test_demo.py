"""The CPU demo (`echo-trl train` with no arguments / `--demo`): end to end on a small synthetic set, its
split, its refusal to overwrite a previous run, and its parser."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from echo_trl.commands.cli import main as cli_main
from echo_trl.data.build import build_awm_dataset
from echo_trl.demo import run as demo_run
from echo_trl.demo.episodes import synthetic_episodes, write_episodes
from echo_trl.errors import EchoTrlError

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    """16 synthetic AWM-style episodes (4 tasks x 4) in one file."""
    return write_episodes(synthetic_episodes(n_tasks=4, per_task=4), tmp_path_factory.mktemp("demo") / "eps.jsonl")


def test_no_arguments_runs_the_demo_with_its_defaults(monkeypatch):
    seen = {}
    monkeypatch.setattr(demo_run, "run_demo", lambda args: seen.setdefault("args", args) and 0)
    assert cli_main(["train"]) == 0
    args = seen["args"]
    assert args.world_model_coeff == 0.05 and args.output_dir == "outputs/echo-demo" and args.data_dir is None
    assert args.behavior_policy == "initial"


@pytest.mark.parametrize(
    ("policy", "documented"), [("initial", True), ("current", True), ("recorded", False), ("Initial", False)]
)
def test_the_demo_takes_exactly_the_behavior_policies_the_trainer_takes(policy, documented, tmp_path, capsys):
    """The demo's parser keeps its own copy of the choices (``--help`` must not load TRL): each value is accepted
    by both the demo and ``EchoGRPOConfig`` or refused by both, and the two documented values are accepted."""
    from helpers.trainer import tiny_config

    try:
        tiny_config(tmp_path, behavior_policy=policy)
        trainer_takes = True
    except (ValueError, EchoTrlError):
        trainer_takes = False
    try:
        demo_takes = demo_run.parse_demo_args(["--behavior_policy", policy]).behavior_policy == policy
    except SystemExit:
        demo_takes = False
    capsys.readouterr()
    assert demo_takes == trainer_takes == documented
    assert demo_run.parse_demo_args([]).behavior_policy == tiny_config(tmp_path).behavior_policy  # one default


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the demo: a warm-up and two short trainings on a shared 2-core machine
def test_the_readme_demo_end_to_end(tmp_path, capsys):
    """The README's demo line as written there (its overrides: one step, one warm-up step, 24 bundled episodes),
    run as a user's shell runs it, offline (the docs test leaves this line to this test); then what it wrote."""
    from helpers.docs import readme_demo, run_line, user_shell

    block, line = readme_demo()
    with user_shell(tmp_path) as (work, env, hub, guard):
        text = run_line(block, line, work, env, capsys)
        assert hub.count == guard.count == 0, f"the demo tried the network: {guard.attempts[:5]}"
        argv = shlex.split(line, comments=True)
        steps, warmup = (int(argv[argv.index(flag) + 1]) for flag in ("--max_steps", "--warmup_steps"))
        out, cache = work / "outputs" / "echo-demo", Path(env["ECHO_TRL_CACHE"])
        assert "ECHO (lambda=0.05)" in text and "GRPO (lambda=0)" in text and "before" in text
        metrics = json.loads((out / "metrics.json").read_text())
        runs = metrics["runs"]
        echo, grpo = runs["ECHO (lambda=0.05)"], runs["GRPO (lambda=0)"]
        assert [s for s, _ in echo["eval_curve"]] == list(range(steps + 1))  # --eval_steps 1: every step
        assert echo["heldout_ce_env_before"] == pytest.approx(grpo["heldout_ce_env_before"])  # same start model
        assert echo["eval_curve"][-1][1] == pytest.approx(echo["heldout_ce_env_after"], rel=1e-4)
        assert (out / "env_ce.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        for name in ("echo", "grpo_baseline"):
            assert (out / name / "model.safetensors").exists() and (out / name / "trainer_state.json").exists()
        assert list(cache.glob("tiny-qwen3-*/echo_trl_tiny.json"))
        warm = list(cache.glob("tiny-qwen3-*-warm-*/echo_trl_warmup.json"))
        assert len(warm) == 1 and metrics["model"] == str(warm[0].parent)  # both runs start from the warmed model
        assert metrics["warmup"]["settings"]["steps"] == warmup
        outputs = Path("outputs") / "echo-demo"
        assert f"wrote {outputs / 'metrics.json'}, {outputs / 'env_ce.png'}, models in {outputs / 'echo'} and " in text

        # a second run into the same directory refuses before doing any work, and leaves the first run's results
        before = (out / "metrics.json").read_bytes()
        rc = cli_main(["train", "--demo", "--data_dir", "/nonexistent", "--max_steps", "1"])
        err = capsys.readouterr().err
        assert rc == 2 and "--overwrite_output_dir" in err and "metrics.json" in err and "no episode files" not in err
        assert (out / "metrics.json").read_bytes() == before


def test_overwrite_output_dir_is_the_only_way_over_a_previous_run(tmp_path):
    out = tmp_path / "run"
    demo_run.claim_output_dir(out, overwrite=False)  # new directory: created
    assert out.is_dir()
    (out / "episodes").mkdir()  # inputs a run wrote are not results: no refusal
    demo_run.claim_output_dir(out, overwrite=False)
    (out / "grpo_baseline").mkdir()
    (out / "env_ce.png").write_text("x")
    for name in ("env_ce.png", "grpo_baseline"):
        with pytest.raises(EchoTrlError, match=f"previous demo run .*{name}.*--overwrite_output_dir"):
            demo_run.claim_output_dir(out, overwrite=False)
    demo_run.claim_output_dir(out, overwrite=True)
    assert (out / "env_ce.png").read_text() == "x"  # claiming deletes nothing; the run writes over it


def test_demo_flags_are_never_abbreviated(capsys):
    with pytest.raises(SystemExit) as exc:
        demo_run.parse_demo_args(["--max_step", "2"])
    assert exc.value.code == 2 and "unrecognized arguments: --max_step" in capsys.readouterr().err
    assert demo_run.parse_demo_args(["--overwrite_output_dir"]).overwrite_output_dir


def test_demo_split_follows_splits_json_and_tools_shrink_to_names(episodes, tmp_path):
    ds = build_awm_dataset([episodes])
    spec = tmp_path / "splits.json"
    scenario, task = ds[0]["scenario"], ds[0]["task_idx"]
    spec.write_text(json.dumps({scenario: {"train": [], "held_out": [task]}}))
    train, held = demo_run.split_by_task(ds, spec)
    assert set(held["group_id"]) == {f"{scenario}/{task}"} and len(train) + len(held) == len(ds)
    train, held = demo_run.split_by_task(ds, None)  # no spec: every 4th task group is held out
    assert len(set(held["group_id"])) == 1 and not set(held["group_id"]) & set(train["group_id"])
    full = {
        "type": "function",
        "function": {
            "name": "get_book",
            "description": "x" * 500,
            "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
        },
    }
    small = demo_run.names_only_tools(ds.map(lambda r: {"tools": [json.dumps(full)]}))
    tool = json.loads(small[0]["tools"][0])
    assert tool["function"]["name"] == "get_book" and tool["function"]["description"] == ""
