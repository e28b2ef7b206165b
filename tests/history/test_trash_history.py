"""``smqp-sql`` over a ``trash`` table that a retention sweep deleted from: the job's sink (real
Spark, real broker, Delta on disk) trashes two messages, then its Trash sweep removes one.

Current reads must not show the swept row; Delta's own time travel (``VERSION AS OF``,
``TIMESTAMP AS OF``, ``--version``, ``--as-of``) to before the sweep must; ``DESCRIBE HISTORY``
shows the sweep as a DELETE.
"""

from __future__ import annotations

import csv
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
from deltalake import DeltaTable

from deploy.broker import create_topics
from schemas import events as ev
from schemas.config import SMQPConfig, load_config
from schemas.spark import KAFKA_RECORD
from streaming.history import main
from streaming.sink import CommandSink

pytestmark = pytest.mark.e2e

T0 = 1_700_000_000_000_000  # microseconds
SECOND = 1_000_000


@dataclass
class Swept:
    config: SMQPConfig
    before: int  # the trash table's version holding both messages
    moment: datetime  # a time between that version and the sweep's DELETE

    @property
    def data_dir(self) -> str:
        return self.config.data_dir


def _batch(spark, events, first_offset: int):
    rows = [(None, e.to_bytes(), "cmd", 0, first_offset + i, datetime(2024, 1, 1, tzinfo=timezone.utc), 0)
            for i, e in enumerate(events)]
    return spark.createDataFrame(rows, KAFKA_RECORD)


@pytest.fixture(scope="module")
def swept(broker, spark, tmp_path_factory) -> Swept:
    """Retention one minute, a sweep at every batch: message 1 is trashed at T0+100 µs, message 2 at
    T0+40 s; the batch at T0+61 s sweeps message 1 away (tests/streaming/test_trash_retention.py)."""
    uid = uuid.uuid4().hex[:8]
    config = load_config(env={}, data_dir=str(tmp_path_factory.mktemp("swept")), kafka={
        "bootstrap": broker.bootstrap, "commands_topic": f"cmd-{uid}", "deliveries_topic": f"dlv-{uid}",
    }, streaming={"query_name": f"router-{uid}", "trash_retention": "00:00:01:00", "trash_sweep_interval_s": 0})
    create_topics(config.kafka)
    sink = CommandSink(config)
    try:
        sink(_batch(spark, [ev.Subscribe("bob", "gb", "/t", T0),
                            ev.Publish(1, "/t", "c1", "alice", "ga", T0 + 1, expires_at=T0 + 100),
                            ev.Publish(2, "/t", "c2", "alice", "ga", T0 + 2, expires_at=T0 + 40 * SECOND)], 0), 0)
        sink(_batch(spark, [ev.Tick(T0 + 100)], 3), 1)
        sink(_batch(spark, [ev.Tick(T0 + 40 * SECOND)], 4), 2)
        trash = DeltaTable(config.table_path("trash"))
        assert sorted(trash.to_pyarrow_table(columns=["smuid"]).column("smuid").to_pylist()) == [1, 2]
        before = trash.version()
        time.sleep(0.05)  # the sweep's commit comes strictly after `moment`
        moment = datetime.now(timezone.utc)
        time.sleep(0.05)
        sink(_batch(spark, [ev.Tick(T0 + 61 * SECOND)], 5), 3)
    finally:
        sink.close()
    assert [h["operation"] for h in DeltaTable(config.table_path("trash")).history(1)] == ["DELETE"]
    return Swept(config=config, before=before, moment=moment)


def rows(swept: Swept, tmp_path, statement: str, *options: str) -> list[dict]:
    """``smqp-sql`` in process, written as CSV: the rows."""
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}.csv"
    assert main([statement, "--data-dir", swept.data_dir, "--csv", str(out), *options]) == 0
    with open(out, newline="") as handle:
        return list(csv.DictReader(handle))


def smuids(found: list[dict]) -> list[int]:
    return sorted(int(r["smuid"]) for r in found)


def test_the_current_trash_no_longer_holds_what_the_sweep_deleted(swept, tmp_path):
    assert smuids(rows(swept, tmp_path, "SELECT smuid FROM trash")) == [2]
    # the deliveries keep saying why: both expired
    assert {(int(r["smuid"]), r["status"]) for r in rows(swept, tmp_path, "SELECT smuid, status FROM deliveries")} \
        == {(1, "expired"), (2, "expired")}


def test_time_travel_in_the_statement_reads_the_trash_before_the_sweep(swept, tmp_path):
    assert smuids(rows(swept, tmp_path, f"SELECT smuid FROM trash VERSION AS OF {swept.before}")) == [1, 2]
    assert smuids(rows(swept, tmp_path, f"SELECT smuid FROM trash TIMESTAMP AS OF '{swept.moment.isoformat()}'")) \
        == [1, 2]
    # past and present in one statement: what the sweep removed
    gone = rows(swept, tmp_path, f"""SELECT smuid, reason FROM trash VERSION AS OF {swept.before}
                                     WHERE smuid NOT IN (SELECT smuid FROM trash)""")
    assert [(int(r["smuid"]), r["reason"]) for r in gone] == [(1, "expired")]


def test_pins_read_the_trash_before_the_sweep(swept, tmp_path):
    assert smuids(rows(swept, tmp_path, "SELECT smuid FROM trash", "--version", f"trash={swept.before}")) == [1, 2]
    assert smuids(rows(swept, tmp_path, "SELECT smuid FROM trash", "--as-of", swept.moment.isoformat())) == [1, 2]


def test_describe_history_shows_the_sweep_as_a_delete(swept, tmp_path):
    history = rows(swept, tmp_path, "DESCRIBE HISTORY trash")
    latest = max(history, key=lambda r: int(r["version"]))
    assert latest["operation"] == "DELETE" and int(latest["version"]) > swept.before
    assert "trashed_at" in latest["operationParameters"]  # the predicate: the retention's cut-off
    assert next(r for r in history if int(r["version"]) == swept.before)["operation"] != "DELETE"
    commits = rows(swept, tmp_path, "SELECT version, operation, parameters, app_id FROM table_versions "
                                    "WHERE table = 'trash' AND operation = 'DELETE'")
    assert [int(r["version"]) for r in commits] == [int(latest["version"])]
    assert "trashed_at" in commits[0]["parameters"] and not commits[0]["app_id"]  # the sweep is no batch's write
