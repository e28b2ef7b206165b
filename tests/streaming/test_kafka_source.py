"""The ``smqp_kafka`` source against the real dev broker (tansu) and real Spark."""

from __future__ import annotations

import pickle
import time
import uuid

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from schemas.spark import KAFKA_RECORD
from streaming.kafka_source import KafkaSourceError, KafkaStreamReader

pytestmark = pytest.mark.e2e


def new_topic(broker, partitions: int = 2) -> str:
    name = f"src-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()
    return name


def produce(broker, topic: str, values: list[bytes], partitions: int = 2) -> None:
    """``values[i]`` goes to partition ``i % partitions``, key ``k<i>``; waits for acks=all."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=1)
    try:
        futures = [producer.send(topic, key=f"k{i}".encode(), value=v, partition=i % partitions)
                   for i, v in enumerate(values)]
        producer.flush(timeout=30)
        for f in futures:
            f.get(timeout=30)
    finally:
        producer.close(timeout=10)


class Collector:
    """foreachBatch function that keeps every row it sees (runs on the driver)."""

    def __init__(self):
        self.rows = []
        self.batches = 0

    def __call__(self, batch_df, batch_id):
        assert batch_df.schema == KAFKA_RECORD
        self.rows.extend(batch_df.collect())
        self.batches += 1


def start(spark, broker, topic, checkpoint, collector, available_now=False, max_records=20000):
    writer = (
        spark.readStream.format("smqp_kafka")
        .option("bootstrap", broker.bootstrap).option("topic", topic)
        .option("maxRecordsPerBatch", str(max_records)).option("pollTimeoutMs", "50")
        .load()
        .writeStream.foreachBatch(collector).option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def wait_for(query, collector, count: int, timeout: float = 60.0) -> None:
    """processAllAvailable until ``count`` rows arrived (bounded)."""
    deadline = time.monotonic() + timeout
    while len(collector.rows) < count:
        assert time.monotonic() < deadline, f"only {len(collector.rows)} of {count} rows after {timeout}s"
        query.processAllAvailable()


def keyed(rows):
    return sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in rows)


def test_stream_reads_every_record_once_then_more(spark, broker, tmp_path):
    topic = new_topic(broker)
    first = [f"v{i}".encode() for i in range(50)]
    produce(broker, topic, first)
    collector = Collector()
    query = start(spark, broker, topic, tmp_path / "cp", collector)
    try:
        wait_for(query, collector, 50)
        expected = sorted((i % 2, i // 2, f"k{i}".encode(), v) for i, v in enumerate(first))
        assert keyed(collector.rows) == expected
        row = collector.rows[0]
        assert row["topic"] == topic and row["timestamp"] is not None and row["timestampType"] == 0

        more = [f"w{i}".encode() for i in range(30)]
        produce(broker, topic, more)
        wait_for(query, collector, 80)
        assert len(collector.rows) == 80
        assert len({(r["partition"], r["offset"]) for r in collector.rows}) == 80
        assert sorted(r["value"] for r in collector.rows) == sorted(first + more)
    finally:
        query.stop()


def test_restart_resumes_from_checkpoint_and_respects_batch_limit(spark, broker, tmp_path):
    topic = new_topic(broker)
    produce(broker, topic, [f"a{i}".encode() for i in range(40)])
    first = Collector()
    query = start(spark, broker, topic, tmp_path / "cp", first, max_records=15)
    try:
        wait_for(query, first, 40)
    finally:
        query.stop()
    assert first.batches >= 3  # 40 records, at most 15 a batch

    produce(broker, topic, [f"b{i}".encode() for i in range(10)])
    second = Collector()
    query = start(spark, broker, topic, tmp_path / "cp", second, available_now=True)
    try:
        assert query.awaitTermination(60), "availableNow query did not finish"
    finally:
        query.stop()
    assert sorted(r["value"] for r in second.rows) == sorted(f"b{i}".encode() for i in range(10))


def test_read_between_offsets_returns_exactly_the_range(broker):
    topic = new_topic(broker)
    produce(broker, topic, [f"r{i}".encode() for i in range(20)])  # 10 per partition
    reader = KafkaStreamReader(broker.bootstrap, topic, replay_timeout_ms=20000)
    batches = list(reader.readBetweenOffsets({"0": 2, "1": 0}, {"0": 7, "1": 3}))
    got = [(p, o) for b in batches for p, o in zip(b.column("partition").to_pylist(),
                                                   b.column("offset").to_pylist())]
    assert got == [(0, o) for o in range(2, 7)] + [(1, o) for o in range(3)]
    values = [v for b in batches for v in b.column("value").to_pylist()]
    assert values[0] == b"r4" and values[-1] == b"r5"  # offset 2 of p0 = record 4; offset 2 of p1 = record 5
    assert list(reader.readBetweenOffsets({"0": 4}, {"0": 4})) == []


def test_read_between_offsets_fails_clearly_when_range_is_missing(broker):
    topic = new_topic(broker)
    produce(broker, topic, [b"x"])
    reader = KafkaStreamReader(broker.bootstrap, topic, replay_timeout_ms=1500)
    with pytest.raises(KafkaSourceError, match="incomplete"):
        list(reader.readBetweenOffsets({"0": 0}, {"0": 5}))


def test_driver_reader_keeps_consumer_out_of_pickles_and_reports_offsets(broker):
    topic = new_topic(broker)
    produce(broker, topic, [f"p{i}".encode() for i in range(6)])
    reader = KafkaStreamReader(broker.bootstrap, topic)
    try:
        start_offsets = reader.initialOffset()
        assert start_offsets == {"0": 0, "1": 0}
        batches, end = reader.read(start_offsets)
        assert end == {"0": 3, "1": 3}
        assert sum(b.num_rows for b in batches) == 6
        copy = pickle.loads(pickle.dumps(reader))
        assert copy._consumer is None and reader._consumer is not None
        batches, again = reader.read(end)
        assert again == end and list(batches) == []
    finally:
        reader.stop()


def test_the_readers_fetch_wait_grows_while_the_broker_answers_empty_and_returns_once_idle(broker):
    """The dev broker answers a fetch empty when it cannot gather the records within the fetch's
    wait: the reader lengthens the wait of its live consumer while that happens (else a job far
    behind never catches up), and is back at its own once nothing more is there."""
    topic = new_topic(broker)
    produce(broker, topic, [f"p{i}".encode() for i in range(4)])
    reader = KafkaStreamReader(broker.bootstrap, topic, poll_timeout_ms=20)
    try:
        batches, end = reader.read(reader.initialOffset())
        fetcher = reader._consumer._fetcher.config  # what kafka-python builds each FetchRequest from
        assert fetcher["fetch_max_wait_ms"] == 20
        reader._pace(reader._consumer, got_records=False, behind=True)
        reader._pace(reader._consumer, got_records=False, behind=True)
        assert fetcher["fetch_max_wait_ms"] == 80
        reader.read(end)  # nothing new: idle
        assert fetcher["fetch_max_wait_ms"] == 20
    finally:
        reader.stop()


def test_missing_topic_is_a_clear_error(broker):
    reader = KafkaStreamReader(broker.bootstrap, f"nope-{uuid.uuid4().hex[:8]}", metadata_timeout_ms=1000)
    try:
        with pytest.raises(KafkaSourceError, match="not found"):
            reader.initialOffset()
    finally:
        reader.stop()
