"""Output directories: the shared --output check, atomic replacement (kill -9, failures) and the lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers.episodes import openenv_episode
from helpers.processes import unprivileged

from echo_trl.data.build import trajectories_to_dataset
from echo_trl.data.readers.records import awm_episode_to_trajectory
from echo_trl.data.store import load_echo_dataset, save_dataset
from echo_trl.errors import EchoTrlError
from echo_trl.io import atomic
from echo_trl.io.outputs import atomic_output_dir, check_output_dir, output_lock

REPO = Path(__file__).resolve().parents[2]


def _dataset(*task_idx):
    return trajectories_to_dataset([awm_episode_to_trajectory(openenv_episode(task_idx=k)) for k in task_idx])


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


# --------------------------------------------------------------------------------------------
# The shared check


def test_output_that_is_a_file_or_under_a_file(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("keep me")
    for kind in (None, "dataset_info.json"):
        with pytest.raises(EchoTrlError, match=r"^--output .*f.txt: is a file, not a directory$"):
            check_output_dir(f, replace_if=kind)
        with pytest.raises(
            EchoTrlError, match=r"^--output .*f.txt/sub/ds: is under .*f.txt, which is not a directory$"
        ):
            check_output_dir(f / "sub" / "ds", replace_if=kind)
    assert f.read_text() == "keep me"


def test_write_into_creates_and_replace_does_not(tmp_path):
    assert check_output_dir(tmp_path / "a" / "b").is_dir()
    assert not check_output_dir(tmp_path / "c" / "d", replace_if="dataset_info.json").exists()
    assert _siblings(tmp_path / "a") == []  # no probe files left behind


def test_a_directory_of_other_things_is_never_replaced(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    with pytest.raises(EchoTrlError, match=r"exists and is not a previous output \(no dataset_info.json\)"):
        save_dataset(_dataset(1), home)
    assert (home / "thesis.tex").read_text() == "years of work" and _siblings(home) == []
    (tmp_path / "empty").mkdir()
    assert load_echo_dataset(save_dataset(_dataset(1), tmp_path / "empty"))["task_idx"] == [1]


def test_read_only_output_and_parent_are_one_line_errors(tmp_path):
    prefix = unprivileged()
    ro = tmp_path / "ro"
    ro.mkdir()
    ds_dir = tmp_path / "ds"
    save_dataset(_dataset(1), ds_dir)
    ds_dir.chmod(0o555)
    ro.chmod(0o555)
    code = (
        "import sys; from echo_trl.io.outputs import check_output_dir as c\n"
        "for path, kind in [(sys.argv[1], None), (sys.argv[2], 'dataset_info.json'), (sys.argv[3], None),"
        " (sys.argv[3], 'dataset_info.json')]:\n"
        "    try: c(path, replace_if=kind); print('ok')\n"
        "    except Exception as e: print(type(e).__name__, e)\n"
    )
    try:
        r = subprocess.run(
            [*prefix, sys.executable, "-c", code, str(ro / "out"), str(ds_dir), str(ds_dir)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=60,
        )
    finally:
        ro.chmod(0o755)
        ds_dir.chmod(0o755)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 4, r.stderr
    assert lines[0] == f"EchoTrlError --output {ro / 'out'}: cannot create it (Permission denied)"
    assert lines[1] == f"EchoTrlError --output {ds_dir}: cannot write in {ds_dir} (Permission denied)"
    assert lines[2] == lines[3] == lines[1]
    assert load_echo_dataset(ds_dir)["task_idx"] == [1]


# --------------------------------------------------------------------------------------------
# Atomic replacement


def test_failed_save_leaves_the_previous_dataset_intact(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    save_dataset(_dataset(1, 2), out, skipped=[])
    before = sorted(p.name for p in out.iterdir())
    new = _dataset(7)
    real = type(new).save_to_disk

    def half_then_fail(self, path, **kw):
        real(self, path, **kw)  # the whole new dataset written ...
        raise OSError(28, "No space left on device")  # ... then the disk fills

    monkeypatch.setattr(type(new), "save_to_disk", half_then_fail)
    with pytest.raises(
        EchoTrlError,
        match=r"no space left on device \(needs about [\d.]+ KiB, [\d.]+ \w+ free\); the previous output is "
        "unchanged",
    ):
        save_dataset(new, out)
    monkeypatch.undo()
    assert load_echo_dataset(out)["task_idx"] == [1, 2] and sorted(p.name for p in out.iterdir()) == before
    assert _siblings(out) == []  # temp dir and lock removed
    with pytest.raises(KeyboardInterrupt), atomic_output_dir(out, replace_if="dataset_info.json") as tmp:
        (tmp / "partial").write_text("x")
        raise KeyboardInterrupt  # Ctrl-C mid-save
    assert load_echo_dataset(out)["task_idx"] == [1, 2] and _siblings(out) == []
    save_dataset(new, out)
    assert load_echo_dataset(out)["task_idx"] == [7]
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # not mkdtemp's 0o700


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_replacement_without_renameat2_and_recovery_of_a_parked_copy(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    save_dataset(_dataset(1), out)
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)  # e.g. not Linux: two renames
    save_dataset(_dataset(2), out)
    assert load_echo_dataset(out)["task_idx"] == [2] and _siblings(out) == []
    # Killed between the two renames: only the parked previous output exists. The next writer restores it.
    out.rename(tmp_path / ".ds.old-abc123")
    with pytest.raises(RuntimeError), atomic_output_dir(out, replace_if="dataset_info.json"):
        raise RuntimeError("this attempt fails too")
    assert load_echo_dataset(out)["task_idx"] == [2] and _siblings(out) == []


def test_a_link_to_the_output_stays_a_link(tmp_path):
    save_dataset(_dataset(1), tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    save_dataset(_dataset(2), tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and load_echo_dataset(tmp_path / "real")["task_idx"] == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]


PAUSED_SAVE = textwrap.dedent("""
    import sys, time, pathlib
    import echo_trl.data.build as build
    real = build._finish_layout  # the streaming build's last step: shards and metadata in place
    def paused(directory, shards):
        real(directory, shards)  # the new dataset is on disk, in the temporary sibling
        pathlib.Path(sys.argv[1]).write_text(str(directory))
        time.sleep(600)
    build._finish_layout = paused
    from echo_trl.commands.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def _paused_build(tmp_path, episodes, out):
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED_SAVE, str(ready), "build-dataset", str(episodes), "--output", str(out)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not ready.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "the paused build never reached the save"
        time.sleep(0.05)
    return proc, Path(ready.read_text())


def test_kill_9_mid_save_keeps_the_previous_dataset_and_a_second_writer_is_refused(tmp_path):
    out = tmp_path / "ds"
    save_dataset(_dataset(1, 2), out)
    old_card = (out / "README.md").read_text()
    episodes = tmp_path / "new.jsonl"
    episodes.write_text(json.dumps(openenv_episode(task_idx=9)) + "\n")
    proc, tmp = _paused_build(tmp_path, episodes, out)
    try:
        assert tmp.parent == out.parent and tmp.name.startswith(".ds.tmp-") and (tmp / "dataset_info.json").exists()
        # A second writer while the first holds the lock: refused at once, nothing touched.
        with pytest.raises(EchoTrlError, match=rf"another process \(pid {proc.pid}\) is writing this output"):
            save_dataset(_dataset(5), out)
        second = subprocess.run(
            [sys.executable, "-m", "echo_trl.commands.cli", "build-dataset", str(episodes), "--output", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO), "ECHO_TRL_PROGRESS": "0"},
        )
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert (
            second.stderr.strip()
            .splitlines()[-1]
            .startswith(
                f"echo-trl build-dataset: error: {out}: another process (pid {proc.pid}) is writing this output"
            )
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert load_echo_dataset(out)["task_idx"] == [1, 2] and (out / "README.md").read_text() == old_card
    # The next build takes over: the dead writer's lock is free, its temporary directory removed.
    save_dataset(_dataset(3), out)
    assert load_echo_dataset(out)["task_idx"] == [3] and _siblings(out) == ["new.jsonl", "ready"]


def test_lock_is_released_and_reusable(tmp_path):
    out = tmp_path / "x"
    with output_lock(out) as lock:
        assert lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(EchoTrlError, match="is writing this output"), output_lock(tmp_path / "x"):
            pass
    assert not lock.exists()
    with output_lock(out):
        pass
