"""Emptying the Trash (streaming.retention) on a real ``trash`` Delta table on disk."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from schemas.config import load_config
from schemas.spark import TRASH_TABLE, arrow_schema
from streaming.retention import TrashSweeper, delete_trashed_before, retention_micros

T0 = datetime(2026, 11, 22, 8, 0, tzinfo=timezone.utc)
MINUTE = 60_000_000  # microseconds
DAY = 24 * 60 * MINUTE
EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "smqp.example.toml"


def micros(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)


def trash_row(smuid: int, trashed_at: datetime, topic: str = "/t") -> dict:
    return {"smuid": smuid, "topic": topic, "trash_topic": f"{topic}/Trash", "reason": "expired",
            "trashed_at": trashed_at, "publisher": "alice", "cmuid": f"c{smuid}", "headers": [],
            "sections": [{"headers": [["Content-Type", "text/plain"]], "data": "eA=="}], "batch_id": smuid}


def write(path, *rows: dict) -> None:
    """One append (one file) per call, as the sink's per-batch merges add them."""
    write_deltalake(str(path), pa.Table.from_pylist(list(rows), schema=arrow_schema(TRASH_TABLE)), mode="append")


def smuids(path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table(columns=["smuid"]).column("smuid").to_pylist())


def test_rows_trashed_before_the_cutoff_go_and_the_rest_stay(tmp_path):
    path = tmp_path / "trash"
    write(path, trash_row(1, T0), trash_row(2, T0 + timedelta(minutes=1), "/u"))
    write(path, trash_row(3, T0 + timedelta(minutes=2)), trash_row(4, T0 + timedelta(minutes=3)))

    cutoff = micros(T0 + timedelta(minutes=2))  # exactly row 3's time: kept (strictly older go)
    assert delete_trashed_before(str(path), cutoff) == 2
    assert smuids(path) == [3, 4]
    version = DeltaTable(str(path)).version()
    assert DeltaTable(str(path)).history(1)[0]["operation"] == "DELETE"

    assert delete_trashed_before(str(path), cutoff) == 0  # nothing left that old: no commit at all
    assert DeltaTable(str(path)).version() == version
    assert delete_trashed_before(str(path), cutoff + 1) == 1
    assert smuids(path) == [4]
    # time travel still shows what the sweeps removed (until the table is vacuumed)
    assert sorted(DeltaTable(str(path), version=1).to_pyarrow_table().column("smuid").to_pylist()) == [1, 2, 3, 4]


def test_no_trash_table_yet_removes_nothing(tmp_path):
    assert delete_trashed_before(str(tmp_path / "trash"), micros(T0)) == 0
    assert not DeltaTable.is_deltatable(str(tmp_path / "trash"))


@pytest.mark.parametrize("text, expected", [
    ("07:00:00:00", 7 * DAY), ("00:00:01:30", 90_000_000), ("00:02:00", 2 * MINUTE), ("00:00:00:01:50", 1_500_000),
    ("INFINITE", None), ("inf", None), ("-1", None),
])
def test_retention_uses_the_spec_timeout_format(text, expected):
    assert retention_micros(text) == expected


def test_a_bad_retention_fails_at_start_up_naming_the_key(tmp_path):
    config = load_config(env={"SMQP_STREAMING_TRASH_RETENTION": "a week"}, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"\[streaming\] trash_retention: bad timeout 'a week'"):
        TrashSweeper(config)


def test_the_example_configuration_documents_the_defaults():
    example = load_config(EXAMPLE, env={}).streaming
    defaults = load_config(env={}).streaming
    assert (example.trash_retention, example.trash_sweep_interval_s) == \
        (defaults.trash_retention, defaults.trash_sweep_interval_s) == ("07:00:00:00", 3600.0)


def sweeper(tmp_path, retention="00:00:10:00", interval_s=60.0) -> TrashSweeper:
    config = load_config(env={}, data_dir=str(tmp_path),
                         streaming={"trash_retention": retention, "trash_sweep_interval_s": interval_s})
    return TrashSweeper(config)


def test_the_sweeper_runs_once_per_interval_of_the_batches_clock(tmp_path, caplog):
    sweep = sweeper(tmp_path)  # keep 10 minutes, sweep at most once a minute
    path = sweep.path
    write(path, trash_row(1, T0), trash_row(2, T0 + timedelta(minutes=2, seconds=30)),
          trash_row(3, T0 + timedelta(minutes=9)))
    now = micros(T0 + timedelta(minutes=12))
    assert sweep(None) == 0  # a batch without a clock
    with caplog.at_level(logging.INFO, logger="streaming.retention"):
        assert sweep(now) == 1  # the first batch with a clock sweeps: row 1 is 12 minutes old
    assert "removed 1 message(s) trashed before D20261122T08020000Z" in caplog.text
    assert smuids(path) == [2, 3]
    assert sweep(now + 59_000_000) == 0  # row 2 is older than 10 minutes now, but the minute has not passed
    assert smuids(path) == [2, 3]
    assert sweep(now + MINUTE) == 1
    assert smuids(path) == [3]
    assert sweep(now - MINUTE) == 0  # a clock that went back waits for itself


def test_an_infinite_retention_never_deletes(tmp_path):
    sweep = sweeper(tmp_path, retention="INFINITE", interval_s=0)
    write(sweep.path, trash_row(1, T0))
    assert sweep(micros(T0) + 3650 * DAY) == 0
    assert smuids(sweep.path) == [1]


def test_a_failed_sweep_is_logged_and_retried_an_interval_later(tmp_path, caplog):
    """The routing must go on: a table the sweep cannot delete from (here one without a
    ``trashed_at`` column) is reported, not raised."""
    sweep = sweeper(tmp_path, interval_s=60.0)
    write_deltalake(sweep.path, pa.table({"smuid": pa.array([1], pa.int64())}))
    now = micros(T0)
    with caplog.at_level(logging.ERROR, logger="streaming.retention"):
        assert sweep(now) == 0
    assert "trash retention: sweep failed; next try in 60 s" in caplog.text
    assert not sweep.due(now + MINUTE - 1) and sweep.due(now + MINUTE)
