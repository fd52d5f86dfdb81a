"""Kill a CPU training run (SIGKILL) right after a checkpoint, resume it in a fresh process: the following steps
log the same losses and world metrics, and end with the same weights, as an uninterrupted run, bit for bit.

One driver subprocess (this file run as a script) imports torch / TRL once and forks a fresh process per run:
for each configuration an uninterrupted run, a run that SIGKILLs itself in ``on_save`` of checkpoint-3, and a
resume of that checkpoint. All three load the same initial weights saved once by the test.

Documented limitation (``test_logging_window_split_by_the_checkpoint``): with ``save_steps`` not a multiple of
``logging_steps`` the first log after the resume averages only the resumed steps (transformers and TRL keep the
not-yet-logged loss / metric sums in memory only); training itself, and every later log, stays bit-exact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

MAX_STEPS, KILL_AT = 6, 3
#: Run settings shared by all configurations, on top of tests/helpers/trainer.py's ``tiny_config`` (each
#: configuration adds or overrides a few).
BASE = dict(
    max_steps=MAX_STEPS,
    save_strategy="steps",
    save_steps=KILL_AT,
    seed=0,
    learning_rate=1e-2,
    world_model_coeff=0.5,
)
N_TRAJECTORIES = 8
CONFIGS = {
    # 4 optimizer steps per epoch: checkpoint in epoch 0, the resumed steps cross into epoch 1
    "ga1": {},
    # 2 steps per epoch: checkpoint-3 lies in epoch 1 (TRL's sampler replayed epoch 0's order on resume)
    "ga2_later_epoch": dict(gradient_accumulation_steps=2),
    # one generation batch serves 4 micro-batches x 2 iterations = 4 optimizer steps: checkpoint-3 lies inside
    # TRL's generation buffer (TRL dropped the buffer on resume and regenerated with other old log-probs)
    "mid_generation_buffer": dict(gradient_accumulation_steps=2, steps_per_generation=4, num_iterations=2),
    # "ga1" logged every 2 steps: the checkpoint splits the logging window of steps 3-4
    "log_window": dict(logging_steps=2),
    # the configurations above take the starting model's log-probs as behaviour policy (the default, cached
    # at init); this one the policy's own at each update
    "behavior_current": dict(behavior_policy="current"),
}
BIT_EXACT = ["ga1", "ga2_later_epoch", "mid_generation_buffer", "behavior_current"]
TIMING_KEYS = {"step_time"}  # wall-clock metrics differ between any two runs


# --------------------------------------------------------------------------------------------
# Driver (runs in the subprocess)


def _train(mode: str, init: str, out: str, name: str) -> None:
    import torch
    from helpers.trainer import dataset, tiny_config
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from echo_trl.trainer import EchoGRPOTrainer

    trained = []
    os.environ["ECHO_TRL_CACHE"] = str(Path(out) / "echo-cache")  # each run computes its own starting log-probs

    class KillAfterCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):  # fires after the checkpoint folder is written
            if mode == "kill" and state.global_step == KILL_AT:
                os.kill(os.getpid(), signal.SIGKILL)

        def on_step_end(self, args, state, control, **kwargs):
            trained.append(state.global_step)

    args = tiny_config(out, **{**BASE, **CONFIGS[name]})
    trainer = EchoGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(init),
        args=args,
        train_dataset=dataset(N_TRAJECTORIES),
        processing_class=AutoTokenizer.from_pretrained(init),
        callbacks=[KillAfterCheckpoint()],
    )
    trainer.train(resume_from_checkpoint=f"{out}/checkpoint-{KILL_AT}" if mode == "resume" else None)
    Path(out, f"{mode}.json").write_text(json.dumps({"log": trainer.state.log_history, "trained": trained}))
    torch.save(trainer.model.state_dict(), Path(out, f"{mode}.pt"))


def _fork(job: tuple[str, str, str, str]) -> int:
    pid = os.fork()
    if pid == 0:  # a fresh process for every run (the parent only imported)
        code = 0
        try:
            _train(*job)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def _run_all(jobs: list[tuple[str, str, str, str]], width: int = 2) -> dict[str, int]:
    """Run the jobs in forked processes, ``width`` at a time; their exit codes (``-9``: SIGKILL)."""
    pending, running, codes = list(jobs), {}, {}
    while pending or running:
        while pending and len(running) < width:
            job = pending.pop(0)
            running[_fork(job)] = job
        pid, status = os.wait()
        mode, _, _, name = running.pop(pid)
        codes[f"{name}/{mode}"] = os.waitstatus_to_exitcode(status)
    return codes


def _drive(init: str, root: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch  # noqa: F401  (imported once, before forking)
    import transformers  # noqa: F401

    import echo_trl.trainer  # noqa: F401

    codes = _run_all([(mode, init, f"{root}/{name}/{mode}", name) for name in CONFIGS for mode in ("full", "kill")])
    codes |= _run_all([("resume", init, f"{root}/{name}/kill", name) for name in CONFIGS])
    Path(root, "exit_codes.json").write_text(json.dumps(codes))


# --------------------------------------------------------------------------------------------
# Tests


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from helpers.tiny import tiny_model, tiny_tokenizer

    root = tmp_path_factory.mktemp("resume")
    init = root / "init"
    tiny_model().save_pretrained(init)  # every run starts from these weights
    tiny_tokenizer("qwen3").save_pretrained(init)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "ECHO_TRL_PROGRESS": "0",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(init), str(root)], env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0 and (root / "exit_codes.json").exists(), proc.stderr[-4000:]
    codes = json.loads((root / "exit_codes.json").read_text())
    failed = {k: v for k, v in codes.items() if not k.endswith("/kill") and v != 0}
    assert not failed, f"{failed}\n{proc.stderr[-4000:]}"
    return root, codes


def _result(root: Path, name: str, mode: str):
    import torch

    out = root / name / ("kill" if mode == "resume" else mode)
    data = json.loads((out / f"{mode}.json").read_text())
    steps = {h["step"]: h for h in data["log"] if "loss" in h}  # training logs (not the final summary)
    return steps, data["trained"], torch.load(out / f"{mode}.pt")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_run_was_killed_right_after_checkpoint_3(runs, name):
    root, codes = runs
    assert codes[f"{name}/kill"] == -signal.SIGKILL
    out = root / name / "kill"
    ckpt = out / f"checkpoint-{KILL_AT}"
    for f in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        assert (ckpt / f).is_file(), f
    assert json.loads((ckpt / "trainer_state.json").read_text())["global_step"] == KILL_AT
    # nothing past the kill: no results of the killed process; checkpoint-6 is the resumed run's
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{KILL_AT}", f"checkpoint-{MAX_STEPS}"]
    assert not (out / "kill.json").exists()


@pytest.mark.parametrize("name", BIT_EXACT)
def test_resumed_steps_equal_the_uninterrupted_run_bit_for_bit(runs, name):
    import torch

    root, _ = runs
    full, full_trained, full_weights = _result(root, name, "full")
    resumed, resumed_trained, resumed_weights = _result(root, name, "resume")
    assert full_trained == list(range(1, MAX_STEPS + 1))
    assert resumed_trained == list(range(KILL_AT + 1, MAX_STEPS + 1))  # really resumed, not retrained from 0
    assert sorted(full) == sorted(resumed) == list(range(1, MAX_STEPS + 1))
    for step in range(KILL_AT + 1, MAX_STEPS + 1):
        a, b = full[step], resumed[step]
        assert "world/ce_env" in a and "world/loss_unscaled" in a and "loss" in a
        keys = set(a) - TIMING_KEYS
        assert keys == set(b) - TIMING_KEYS, step
        differ = {k: (a[k], b[k]) for k in keys if a[k] != b[k]}  # exact float equality
        assert not differ, f"step {step} (uninterrupted, resumed): {differ}"
    assert len({full[s]["loss"] for s in full}) == MAX_STEPS  # the runs trained: every step logged a new loss
    clipped = [full[s]["clip_ratio/region_mean"] > 0 for s in range(KILL_AT + 1, MAX_STEPS + 1)]
    # behavior_policy="initial" (the default): the resumed steps divide by the starting model's log-probs, which
    # the resumed process computed again, and clip; "current": ratio 1, never clipped
    assert any(clipped) == (CONFIGS[name].get("behavior_policy", "initial") == "initial")
    assert full_weights.keys() == resumed_weights.keys()
    for k, w in full_weights.items():
        assert torch.equal(w, resumed_weights[k]), k


def test_checkpoint_inside_a_generation_buffer_keeps_the_buffer(runs):
    import torch

    root, _ = runs

    def saved(name):
        return torch.load(
            root / name / "kill" / f"checkpoint-{KILL_AT}" / "echo_generation_buffer_0.pt", weights_only=True
        )

    mid = saved("mid_generation_buffer")
    assert mid["step"] == KILL_AT * 2  # micro-batches done: 3 optimizer steps x 2 accumulation steps
    assert len(mid["buffered_inputs"]) == 4 and "old_per_token_logps" in mid["buffered_inputs"][0]
    aligned = saved("ga1")  # the next step generates anyway: nothing to keep
    assert aligned == {"step": KILL_AT, "buffered_inputs": None, "num_processes": 1}


def test_logging_window_split_by_the_checkpoint(runs):
    """Limitation: with logging_steps=2 and save_steps=3, the window of steps 3-4 is split by the checkpoint.
    The uninterrupted run logs the mean of steps 3 and 4, the resumed run the mean of step 4 alone (the
    running loss and TRL's metric lists are not checkpointed). Training, and every later log, stays exact."""
    import torch

    root, _ = runs
    per_step, _, per_step_weights = _result(root, "ga1", "full")  # the same training, logged every step
    full, _, full_weights = _result(root, "log_window", "full")
    resumed, resumed_trained, resumed_weights = _result(root, "log_window", "resume")
    assert resumed_trained == [4, 5, 6] and sorted(full) == sorted(resumed) == [2, 4, 6]
    assert full[4]["loss"] == pytest.approx((per_step[3]["loss"] + per_step[4]["loss"]) / 2, rel=1e-6)
    assert resumed[4]["loss"] == per_step[4]["loss"] != full[4]["loss"]
    assert resumed[4]["world/ce_env"] == per_step[4]["world/ce_env"] != full[4]["world/ce_env"]
    assert {k: v for k, v in full[6].items() if k not in TIMING_KEYS} == {
        k: v for k, v in resumed[6].items() if k not in TIMING_KEYS
    }
    assert all(
        torch.equal(w, resumed_weights[k]) and torch.equal(w, per_step_weights[k]) for k, w in full_weights.items()
    )


if __name__ == "__main__":
    _drive(*sys.argv[1:3])
