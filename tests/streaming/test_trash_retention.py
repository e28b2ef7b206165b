"""The job empties the Trash by its retention, between batches, by the batches' own clock:
the sink with a real Spark session, the real broker and Delta tables on disk."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from deltalake import DeltaTable

from deploy.broker import create_topics
from schemas import events as ev
from schemas.config import load_config
from schemas.spark import KAFKA_RECORD
from streaming.sink import CommandSink

pytestmark = pytest.mark.e2e

T0 = 1_700_000_000_000_000  # microseconds
SECOND = 1_000_000


@pytest.fixture
def config(broker, tmp_path):
    uid = uuid.uuid4().hex[:8]
    cfg = load_config(env={}, data_dir=str(tmp_path), kafka={
        "bootstrap": broker.bootstrap, "commands_topic": f"cmd-{uid}", "deliveries_topic": f"dlv-{uid}",
    }, streaming={"query_name": f"router-{uid}", "trash_retention": "00:00:01:00", "trash_sweep_interval_s": 0})
    create_topics(cfg.kafka)
    return cfg


@pytest.fixture
def sink(config):
    s = CommandSink(config)
    yield s
    s.close()


def batch_frame(spark, events, first_offset=0):
    rows = [(None, e.to_bytes(), "cmd", 0, first_offset + i, datetime(2024, 1, 1, tzinfo=timezone.utc), 0)
            for i, e in enumerate(events)]
    return spark.createDataFrame(rows, KAFKA_RECORD)


def trash(config) -> list[tuple[int, datetime]]:
    rows = DeltaTable(config.table_path("trash")).to_pyarrow_table(columns=["smuid", "trashed_at"]).to_pylist()
    return sorted((r["smuid"], r["trashed_at"]) for r in rows)


def at(micros: int) -> datetime:
    return datetime.fromtimestamp(micros // SECOND, timezone.utc).replace(microsecond=micros % SECOND)


def test_the_trash_keeps_a_message_for_the_retention_in_tick_only_and_routing_batches(spark, config, sink, monkeypatch):
    """Retention one minute, a sweep at every batch.  Message 1 is trashed at T0+100 µs, message 2
    at T0+40 s.  A tick-only batch at T0+61 s (no Spark job) removes message 1; a routing batch at
    T0+101 s removes message 2 and routes message 3.  (By the wall clock, T0 being 2023, both
    would have gone at the first sweep.)"""
    routed = []  # the batches that ran the routing query (a Spark job)
    real_outputs = CommandSink.outputs

    def outputs(self, frame, batch_id, *rest):
        routed.append(batch_id)
        return real_outputs(self, frame, batch_id, *rest)

    monkeypatch.setattr(CommandSink, "outputs", outputs)

    sink(batch_frame(spark, [ev.Subscribe("bob", "gb", "/t", T0),
                             ev.Publish(1, "/t", "c1", "alice", "ga", T0 + 1, expires_at=T0 + 100),
                             ev.Publish(2, "/t", "c2", "alice", "ga", T0 + 2, expires_at=T0 + 40 * SECOND)]), 0)
    sink(batch_frame(spark, [ev.Tick(T0 + 100)], 3), 1)
    sink(batch_frame(spark, [ev.Tick(T0 + 40 * SECOND)], 4), 2)
    assert trash(config) == [(1, at(T0 + 100)), (2, at(T0 + 40 * SECOND))]

    sink(batch_frame(spark, [ev.Tick(T0 + 61 * SECOND)], 5), 3)  # only the clock moved
    assert routed == [0, 1, 2]  # batch 3 took the tick-only path: no Spark job …
    assert trash(config) == [(2, at(T0 + 40 * SECOND))]  # … and still swept: message 1 is 61 s old

    sink(batch_frame(spark, [ev.Publish(3, "/t", "c3", "alice", "ga", T0 + 101 * SECOND)], 6), 4)
    assert routed == [0, 1, 2, 4]
    assert trash(config) == []  # message 2 is 61 s old by this batch's clock
    deliveries = DeltaTable(config.table_path("deliveries")).to_pyarrow_table().to_pylist()
    assert sorted((d["smuid"], d["status"]) for d in deliveries) == [(1, "expired"), (2, "expired"), (3, "pending")]
    operations = [h["operation"] for h in DeltaTable(config.table_path("trash")).history()]
    assert operations.count("DELETE") == 2  # one commit per sweep that found something, none otherwise

