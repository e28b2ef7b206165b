"""Two Delta implementations share the engine's tables: the job commits and the gateways read with
delta-rs, while ``smqp sql`` and an operator's own Spark session use delta-spark.  What one writes,
the other must read the same, on the table features the tables are pinned to."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest

from gateway.server.message_store import MessageStore
from schemas.config import load_config
from schemas.spark import MESSAGES_TABLE, TABLE_PROPERTIES, arrow_schema
from streaming.sink import CommandSink

pytestmark = pytest.mark.e2e

TOPIC = "/stocks/quotes/ibm"


def _messages(smuids) -> pa.Table:
    accepted = datetime(2026, 11, 27, tzinfo=timezone.utc)
    return pa.Table.from_pylist(
        [{"smuid": s, "topic": TOPIC, "cmuid": f"c{s}", "publisher": "ann", "publisher_guid": "g1",
          "priority": s % 3, "headers": [["Subject", f"quote {s}"]],
          "sections": [{"headers": [["Content-Type", "text/plain"]], "data": "SUJN"}],
          "accepted_at": accepted, "batch_id": 0} for s in smuids],
        schema=arrow_schema(MESSAGES_TABLE))


@pytest.fixture
def engine_tables(tmp_path):
    """A ``messages`` table made and committed by the job's sink (delta-rs), and the gateways' reader."""
    config = load_config(env={}, data_dir=str(tmp_path))
    sink = CommandSink(config)
    sink._commit_messages(_messages(range(1, 7)), batch_id=0)
    return config, MessageStore(config.table_path("messages"), config.table_path("deliveries"))


def test_the_job_creates_its_tables_with_the_pinned_properties(spark, engine_tables):
    path = engine_tables[0].table_path("messages")
    [detail] = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()
    assert TABLE_PROPERTIES.items() <= detail["properties"].items()
    assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (1, 2)


def test_delta_spark_reads_what_the_job_wrote(spark, engine_tables):
    path = engine_tables[0].table_path("messages")
    rows = spark.sql(f"SELECT smuid, headers, accepted_at FROM delta.`{path}` ORDER BY smuid").collect()
    assert [r["smuid"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["headers"] == [["Subject", "quote 1"]]
    assert rows[0]["accepted_at"] == datetime(2026, 11, 27)  # the session's UTC, as a naive timestamp


def test_the_gateways_read_what_an_operators_delta_spark_session_changed(spark, engine_tables):
    """An operator deletes, updates and compacts with Spark, on a session whose defaults would turn
    deletion vectors on: the gateways' delta-rs reader sees exactly the result, and the job can still
    commit to the table afterwards."""
    config, store = engine_tables
    path = config.table_path("messages")
    assert store.smuids(TOPIC) == [1, 2, 3, 4, 5, 6]
    spark.conf.set("spark.databricks.delta.properties.defaults.enableDeletionVectors", "true")
    try:
        spark.sql(f"DELETE FROM delta.`{path}` WHERE smuid IN (2, 5)")
        spark.sql(f"UPDATE delta.`{path}` SET priority = 9 WHERE smuid = 3")
        spark.sql(f"OPTIMIZE delta.`{path}`")
    finally:
        spark.conf.unset("spark.databricks.delta.properties.defaults.enableDeletionVectors")
    assert store.smuids(TOPIC) == [1, 3, 4, 6]
    assert {m.smuid: m.priority for m in store.messages(TOPIC)} == {1: 1, 3: 9, 4: 1, 6: 0}
    [detail] = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()
    assert (detail["minReaderVersion"], detail["minWriterVersion"]) == (1, 2)  # no reader feature was added

    CommandSink(config)._commit_messages(_messages([7]), batch_id=1)
    assert store.smuids(TOPIC) == [1, 3, 4, 6, 7]


def test_a_table_made_before_the_pin_gets_it_at_the_jobs_next_commit(spark, tmp_path):
    from deltalake import DeltaTable, write_deltalake

    config = load_config(env={}, data_dir=str(tmp_path))
    path = config.table_path("messages")
    write_deltalake(path, _messages([1]))  # as an older job made it: no table properties
    CommandSink(config)._commit_messages(_messages([2]), batch_id=0)
    configured = DeltaTable(path).metadata().configuration
    assert configured["delta.enableDeletionVectors"] == "false"
    assert configured["delta.enableChangeDataFeed"] == "false"
    assert "delta.columnMapping.mode" not in configured  # absent means none; delta-rs cannot set it later
    assert sorted(r["smuid"] for r in spark.sql(f"SELECT smuid FROM delta.`{path}`").collect()) == [1, 2]
