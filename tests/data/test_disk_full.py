"""A dataset save on a full disk: one line naming the output and the space it needs; nothing half-written."""

from __future__ import annotations

import os

import pytest
from helpers.shared_data import REPO
from helpers.tmpfs import fill, small_tmpfs

from echo_trl.commands.cli import main as cli_main
from echo_trl.data.build import build_awm_dataset
from echo_trl.data.store import save_dataset
from echo_trl.errors import EchoTrlError

EPISODES = REPO / "data" / "episodes"


def test_save_dataset_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    ds = build_awm_dataset([EPISODES / "library_1_task0.jsonl", EPISODES / "library_1_task1.jsonl"])
    with small_tmpfs(tmp_path / "small", 2 << 20) as disk:
        fill(disk, leave=32 << 10)
        with pytest.raises(EchoTrlError) as info:
            save_dataset(ds, disk / "out")
        message = str(info.value)
        assert "\n" not in message and message.startswith(f"--output {disk / 'out'}: no space left on device"), message
        assert f"needs about {ds.data.nbytes / 1024:.1f} KiB" in message
        assert sorted(os.listdir(disk)) == ["ballast"]  # no temporary directory, no lock file, no partial output


def test_build_dataset_on_a_full_disk_exits_2_with_one_line(tmp_path, capsys):
    with small_tmpfs(tmp_path / "small", 2 << 20) as disk:
        fill(disk, leave=32 << 10)
        rc = cli_main(["build-dataset", str(EPISODES), "--output", str(disk / "out")])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert "no space left on device (needs about" in err
        assert sorted(os.listdir(disk)) == ["ballast"]
