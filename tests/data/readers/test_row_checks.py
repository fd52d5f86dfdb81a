"""Row values a trajectory dataset's feature types cannot express, refused where datasets are loaded.

A behaviour log-prob of -1e30 is a valid float64 (every schema check passes), yet TRL's importance ratio
``exp(logp - behaviour_logp)`` overflows float32 from about -88.7 on and one step made every weight NaN. The
accepted range is the documented contract (docs/reliability.md): finite, <= 0 up to 1e-3, >= -50.
"""

from __future__ import annotations

import math

import pytest
from datasets import Dataset
from helpers.episodes import traj

from echo_trl.data import store
from echo_trl.data.build import trajectories_to_dataset
from echo_trl.data.readers.fields import behavior_logprobs
from echo_trl.data.schema import FEATURES, row_to_trajectory, trajectory_to_row
from echo_trl.data.store import check_rows, load_echo_dataset
from echo_trl.errors import DatasetSchemaError, EpisodeError

#: The documented range (docs/reliability.md), written here independently of the code's constants.
FLOOR, TOLERANCE = -50.0, 1e-3


def _dataset(values_by_row: dict[int, list[float] | None], n: int = 5):
    rows = []
    for i in range(n):
        rows.append(traj(behavior=values_by_row.get(i), group=f"g{i}"))
    return trajectories_to_dataset(rows)


@pytest.mark.parametrize(
    "bad, problem",
    [
        (-1e30, "-1e+30 is below the floor -50"),
        (-math.inf, "-inf is below the floor -50"),
        (-9999.0, "-9999 is below the floor -50"),  # vLLM's stand-in for -inf
        (50.0, "50 is above 0"),
        (math.inf, "inf is above 0"),
        (math.nan, "NaN is not a log-prob"),
    ],
)
def test_a_saved_dataset_with_an_impossible_behavior_logprob_is_refused_naming_dataset_row_and_field(
    tmp_path, bad, problem
):
    ds = _dataset({1: None, 3: [-0.5, bad, -0.2], 4: [-0.1]})
    ds.save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(DatasetSchemaError) as err:
        load_echo_dataset(tmp_path / "ds")
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'ds'}: row 3: behavior_logprobs[1]: {problem}"), message
    assert "\n" not in message


def test_rows_are_numbered_across_check_batches_and_null_rows(monkeypatch):
    monkeypatch.setattr(store, "CHECK_BATCH_ROWS", 2)  # row 5 sits in the third Arrow batch, after null rows
    ds = _dataset({0: [-1.0], 2: None, 4: None, 5: [-0.1, -0.2, -60.0]}, n=7)
    with pytest.raises(DatasetSchemaError, match=r"^train: row 5: behavior_logprobs\[2\]: -60 is below"):
        check_rows(ds, "train")
    with pytest.raises(DatasetSchemaError, match=r"^sel: row 1: behavior_logprobs\[2\]"):
        check_rows(ds.select([0, 5, 6]), "sel")  # a selection's own row numbers


def test_the_edges_of_the_documented_range_are_accepted():
    ok = [FLOOR, -1e-9, 0.0, TOLERANCE, -0.0]
    check_rows(_dataset({0: ok}), "edges")
    assert behavior_logprobs(ok) == ok
    for outside in (FLOOR - 1e-6, 2 * TOLERANCE):
        with pytest.raises(DatasetSchemaError, match=r"row 0: behavior_logprobs\[0\]"):
            check_rows(_dataset({0: [outside]}), "outside")
        with pytest.raises(EpisodeError, match=r"behavior_logprobs\[0\]: "):
            behavior_logprobs([outside])


def test_warnings_of_another_length_than_the_completion_are_a_schema_error(tmp_path):
    rows = [trajectory_to_row(traj(group=f"g{i}")) for i in range(3)]
    messages = len(rows[2]["completion"])
    rows[2]["warnings"] = [["rate limited"]]  # one list for several completion messages
    ds = Dataset.from_list(rows, features=FEATURES)
    ds.save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(DatasetSchemaError) as err:
        load_echo_dataset(tmp_path / "ds")
    assert str(err.value) == (
        f"{tmp_path / 'ds'}: row 2: warnings: 1 entries for {messages} completion messages "
        "(one list of warnings per completion message)"
    )
    with pytest.raises(DatasetSchemaError, match=rf"^warnings: 1 entries for {messages} completion messages"):
        row_to_trajectory(rows[2])  # was a ValueError from Trajectory
    rows[2]["warnings"] = []  # none recorded: accepted (no warnings)
    assert row_to_trajectory(rows[2]).warnings == [[] for _ in range(messages)]
