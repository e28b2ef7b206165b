"""The sink's producer to the deliveries topic (``kafka_edge.ThreadedLog``), against a real Kafka node."""

from __future__ import annotations

import dataclasses
import time

import pyarrow as pa
from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2

from deploy.broker import KafkaBroker
from kafka_edge import ThreadedLog
from schemas.config import KafkaConfig, load_config
from schemas.events import Acked, AckedBatch, decode, decode_all
from streaming.sink import CommandSink
from streaming.sink.command_sink import ACKED_PER_RECORD
from tests.conftest import kafka_config


def _config(bootstrap: str, partitions: int = 3, **kafka) -> KafkaConfig:
    return kafka_config(bootstrap, deliveries_partitions=partitions, **kafka)


def _read(config: KafkaConfig, partition: int, count: int) -> list[tuple[bytes | None, bytes]]:
    """The first ``count`` records of one deliveries partition, read by kafka-python's own consumer."""
    consumer = KafkaConsumer(bootstrap_servers=config.bootstrap, enable_auto_commit=False)
    place = TopicPartition(config.deliveries_topic, partition)
    consumer.assign([place])
    consumer.seek_to_beginning(place)
    records, deadline = [], time.monotonic() + 20
    while len(records) < count and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            records += [(record.key, record.value) for record in batch]
    consumer.close()
    return records


def test_records_land_in_order_on_their_keys_partition_and_a_pinned_one_on_its_own(broker):
    """Where kafka-python's producer (and Kafka's Java client) would put them: each account's
    ``Deliver``/``Acked`` records on one partition, in the order sent; ``Progress`` on each partition."""
    config = _config(broker.bootstrap)
    log = ThreadedLog(config, config.deliveries_topic, client_id="test-sink")
    try:
        assert log.partitions == [0, 1, 2]
        accounts = [b"alice", b"bob", b"carol", b"dave"]
        records = [(account, f"{account.decode()} {n}".encode(), None) for n in range(300) for account in accounts]
        first = log.send(records)
        progress = log.send([(None, b"progress", p) for p in log.partitions])
        assert log.wait([first, progress]) == []
    finally:
        log.close()

    for partition in (0, 1, 2):
        mine = [key for key in accounts if (murmur2(key) & 0x7FFFFFFF) % 3 == partition]
        expected = [(key, value) for key, value, _ in records if key in mine] + [(None, b"progress")]
        assert _read(config, partition, len(expected)) == expected


def test_records_kafka_cannot_take_are_reported_by_their_delivery_timeout(tmp_path):
    """The sink fails its batch on them (and Spark runs it again): nothing is taken as sent."""
    with KafkaBroker(tmp_path / "kafka") as own:
        config = _config(own.bootstrap, partitions=1, delivery_timeout_ms=1500)
        log = ThreadedLog(config, config.deliveries_topic, client_id="test-sink")
        try:
            assert log.wait([log.send([(b"bob", b"before", None)])]) == []
            own.stop()
            started = time.monotonic()
            errors = log.wait([log.send([(b"bob", b"lost", None), (None, b"progress", 0)])])
            assert len(errors) == 2
            assert 1.0 <= time.monotonic() - started <= 10
        finally:
            log.close()


def test_the_sinks_acked_records_are_joined_per_partition_in_order(broker, tmp_path):
    """A batch's ``Acked`` go out as :class:`AckedBatch` records of up to ``ACKED_PER_RECORD``:
    each account's on its own partition, after anything sent there before, in the order made."""
    config = load_config(env={}, data_dir=str(tmp_path))
    config = dataclasses.replace(config, kafka=_config(broker.bootstrap))
    accounts = ["alice", "bob", "carol", "dave"]
    acked = [Acked(account, n, "acked" if n % 7 else "expired") for n in range(2 * ACKED_PER_RECORD + 10)
             for account in accounts]
    records = pa.table({"key": pa.array([a.account.encode() for a in acked], pa.binary()),
                        "value": pa.array([a.to_bytes().decode() for a in acked], pa.string())})
    sink = CommandSink(config)
    try:
        sink._flush(sink._emit_acked(records))
    finally:
        sink.close()
    for partition in (0, 1, 2):
        mine = [a for a in acked if (murmur2(a.account.encode()) & 0x7FFFFFFF) % 3 == partition]
        joined = -(-len(mine) // ACKED_PER_RECORD)  # records of up to ACKED_PER_RECORD, rounded up
        read = _read(config.kafka, partition, joined)
        assert all(type(decode(value)) is AckedBatch for _, value in read)
        assert [event for _, value in read for event in decode_all(value)] == mine
