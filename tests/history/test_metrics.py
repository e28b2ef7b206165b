"""The metrics listener: progress reports → rows of the ``metrics`` Delta table."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

import pytest
from deltalake import DeltaTable
from kafka import KafkaProducer

from deploy.broker import create_topics
from schemas import events as ev
from schemas.config import load_config
from schemas.metrics import METRICS_TABLE
from streaming.history import read_table
from streaming.job import build_query
from streaming.metrics import parse_offsets, progress_row, session_listener
from streaming.sink import CommandSink

#: A progress report as Spark's Kafka source gives it: nested offsets, a reported latest offset, state.
SPARK_KAFKA_PROGRESS = {
    "id": "5b3c5f8e-0000-4000-8000-000000000001", "runId": "5b3c5f8e-0000-4000-8000-000000000002",
    "name": "router", "timestamp": "2026-11-22T08:00:00.250Z", "batchId": 7, "batchDuration": 640,
    "numInputRows": 30, "inputRowsPerSecond": 12.5, "processedRowsPerSecond": 46.9,
    "durationMs": {"addBatch": 500, "getBatch": 1, "latestOffset": 20, "queryPlanning": 60,
                   "triggerExecution": 640, "walCommit": 30, "commitOffsets": 25},
    "stateOperators": [{"operatorName": "dedupe", "numRowsTotal": 100, "numRowsUpdated": 4,
                        "memoryUsedBytes": 2048},
                       {"operatorName": "agg", "numRowsTotal": 5, "numRowsUpdated": 1, "memoryUsedBytes": 512}],
    "sources": [{"description": "KafkaV2[Subscribe[smqp.commands]]",
                 "startOffset": {"smqp.commands": {"0": 100, "1": 40}},
                 "endOffset": {"smqp.commands": {"0": 120, "1": 50}},
                 "latestOffset": {"smqp.commands": {"0": 125, "1": 50}},
                 "numInputRows": 30, "inputRowsPerSecond": 12.5, "processedRowsPerSecond": 46.9}],
    "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
}


def test_progress_row_from_a_spark_kafka_source_report():
    row = progress_row(SPARK_KAFKA_PROGRESS)
    assert set(row) == set(METRICS_TABLE.fieldNames())
    assert row["batch_id"] == 7 and row["num_input_rows"] == 30 and row["query_name"] == "router"
    assert row["timestamp"] == datetime(2026, 11, 22, 8, 0, 0, 250000, tzinfo=timezone.utc)
    assert (row["add_batch_ms"], row["query_planning_ms"], row["trigger_execution_ms"]) == (500, 60, 640)
    assert dict(row["durations_ms"])["walCommit"] == 30
    assert (row["state_rows_total"], row["state_rows_updated"], row["state_memory_bytes"]) == (105, 5, 2560)
    assert row["partitions"] == [
        {"source": "smqp.commands", "partition": 0, "start_offset": 100, "end_offset": 120,
         "latest_offset": 125, "lag": 5},
        {"source": "smqp.commands", "partition": 1, "start_offset": 40, "end_offset": 50,
         "latest_offset": 50, "lag": 0},
    ]
    assert row["kafka_lag"] == 5


def test_progress_row_from_our_source_with_probed_ends():
    report = {**SPARK_KAFKA_PROGRESS, "stateOperators": [],
              "sources": [{"description": "PythonMicroBatchStream@1", "startOffset": None,
                           "endOffset": {"0": 10}, "latestOffset": None, "numInputRows": 10}]}
    row = progress_row(report, topic="cmd", latest={0: 35})
    assert row["partitions"] == [{"source": "cmd", "partition": 0, "start_offset": None, "end_offset": 10,
                                  "latest_offset": 35, "lag": 25}]
    assert row["state_rows_total"] is None
    unknown = progress_row(report, topic="cmd")  # no probe: lag unknown, not zero
    assert unknown["kafka_lag"] is None and unknown["partitions"][0]["lag"] is None


def test_parse_offsets_forms():
    assert parse_offsets('{"0": 5, "1": 7}') == {(None, 0): 5, (None, 1): 7}
    assert parse_offsets({"t": {"2": 9}}) == {("t", 2): 9}
    assert parse_offsets("None") == parse_offsets(None) == parse_offsets('{"logOffset": "x"}') == {}


def _produce(config, events) -> None:
    producer = KafkaProducer(bootstrap_servers=config.kafka.bootstrap, acks="all")
    try:
        for future in [producer.send(config.kafka.commands_topic, value=e.to_bytes(), partition=0) for e in events]:
            future.get(timeout=30)
    finally:
        producer.close(timeout=10)


def _metrics(config) -> list[dict]:
    try:
        return sorted(DeltaTable(config.table_path("metrics")).to_pyarrow_table().to_pylist(),
                      key=lambda r: r["batch_id"])
    except Exception:  # not written yet
        return []


@pytest.mark.e2e
def test_listener_records_every_batch_of_the_real_query(broker, spark, tmp_path):
    uid = uuid.uuid4().hex[:8]
    config = load_config(env={}, data_dir=str(tmp_path), kafka={
        "bootstrap": broker.bootstrap, "commands_topic": f"cmd-{uid}", "deliveries_topic": f"dlv-{uid}",
    }, streaming={"query_name": f"router-{uid}", "max_records_per_batch": 10})
    create_topics(config.kafka)
    now = int(time.time() * 1_000_000)
    _produce(config, [ev.Subscribe(account="bob", guid="g1", pattern="/t", accepted_at=now)] + [
        ev.Publish(smuid=1000 + i, topic="/t", cmuid=f"c{i}", account="alice", guid="g2", accepted_at=now + i)
        for i in range(34)])

    sink = CommandSink(config)
    query = build_query(spark, config, available_now=True, sink=sink)
    try:
        assert query.awaitTermination(180), "availableNow run did not finish"
        assert query.exception() is None
    finally:
        query.stop()
        sink.close()
    deadline = time.monotonic() + 30  # the last rows go out when the termination event arrives
    while len(_metrics(config)) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)

    rows = _metrics(config)
    assert [r["batch_id"] for r in rows] == [0, 1, 2, 3]
    assert [r["num_input_rows"] for r in rows] == [10, 10, 10, 5]
    assert {(r["query_name"], r["query_id"], r["run_id"]) for r in rows} == {
        (config.streaming.query_name, str(query.id), str(query.runId))}
    partitions = [r["partitions"] for r in rows]
    assert {len(p) for p in partitions} == {1}  # the commands topic's one partition
    assert all(p[0]["source"] == config.kafka.commands_topic and p[0]["partition"] == 0 for p in partitions)
    assert [p[0]["end_offset"] for p in partitions] == [10, 20, 30, 35]
    assert [p[0]["start_offset"] for p in partitions][1:] == [10, 20, 30]
    # every record was in the topic before the query started: the probe sees the end at 35
    assert [p[0]["latest_offset"] for p in partitions] == [35] * 4
    assert [r["kafka_lag"] for r in rows] == [25, 15, 5, 0]
    for r in rows:
        phases = dict(r["durations_ms"])
        assert r["add_batch_ms"] == phases["addBatch"] > 0
        assert r["trigger_execution_ms"] >= r["add_batch_ms"]
        assert r["timestamp"] <= r["recorded_at"]
    recorder = next(r for r in session_listener(spark).recorders
                    if r.query_name == config.streaming.query_name)
    assert recorder.stats["batches"] == 4 and recorder.stats["errors"] == 0
    assert recorder.stats["rows_written"] == 4

    # Spark reads the map and nested columns back through the history views
    frame = read_table(spark, config, "metrics")
    totals = frame.selectExpr("sum(num_input_rows) AS n", "max(partitions[0].end_offset) AS end",
                              "max(durations_ms['addBatch']) AS slowest").first()
    assert (totals.n, totals.end) == (35, 35) and totals.slowest == max(r["add_batch_ms"] for r in rows)


@pytest.mark.e2e
def test_history_run_recorded_each_batch_once(history):
    rows = _metrics(history.config)
    assert rows and {r["query_name"] for r in rows} == {history.config.streaming.query_name}
    ends = [sum(p["end_offset"] for p in r["partitions"]) for r in rows]  # the commands and the ACKs' own
    assert ends == sorted(ends)
    assert sum(r["num_input_rows"] for r in rows) == ends[-1]  # no batch lost or recorded twice
    assert all(r["partitions"][0]["source"] == history.config.kafka.commands_topic for r in rows)
    assert all(r["kafka_lag"] is not None and r["kafka_lag"] >= 0 for r in rows)


def test_the_lag_probe_gives_up_on_a_kafka_that_is_gone_within_its_timeout(broker):
    """Spark hands every query's progress to the session's listeners on one thread: a probe that
    hung on a Kafka gone away (a stopped test stack, an outage) held up every other query's
    metrics until Spark dropped them ("Dropped 1190 events").  Asked of a port nothing listens
    on, and then of a live broker again, it answers within a few seconds each time."""
    from deploy.broker import free_port
    from streaming.metrics import KafkaEnds

    uid = uuid.uuid4().hex[:8]
    config = load_config(env={}, kafka={"bootstrap": broker.bootstrap, "commands_topic": f"cmd-{uid}",
                                        "deliveries_topic": f"dlv-{uid}"})
    create_topics(config.kafka)
    gone = KafkaEnds(f"127.0.0.1:{free_port()}", config.kafka.commands_topic, timeout_s=2.0)
    alive = KafkaEnds(broker.bootstrap, config.kafka.commands_topic, timeout_s=2.0)
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(Exception):
            gone.ends({0: 0})
        assert time.monotonic() - started < 6
    assert alive.ends({0: 0}) == {0: 0}
