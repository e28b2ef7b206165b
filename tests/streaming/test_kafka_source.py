"""The ``smqp_kafka`` source against a real Kafka node and real Spark."""

from __future__ import annotations

import contextlib
import pickle
import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from schemas import events as ev
from schemas.config import load_config
from schemas.spark import KAFKA_RECORD
from streaming.job import source_options
from streaming.kafka_source import KafkaDataSource, KafkaSourceError, KafkaStreamReader, _QueryCommandScan

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


def read_after_sending(reader, producer, topic: str, value: bytes, partition: int):
    """Appends ``value`` to an empty ``topic``, then reads it from the start: the values read, the
    end offsets, and the seconds the read took."""
    begin = reader.initialOffset()
    producer.send(topic, value=value, partition=partition).get(timeout=30)
    started = time.monotonic()
    batches, end = reader.read(begin)
    return values(batches), end, time.monotonic() - started


@contextlib.contextmanager
def sending_every_50_ms(producer, topic: str, record, per: int = 1):
    """From a thread, sends ``per`` records ``record(n)``, each a (value, partition), every 50 ms (never
    a 300 ms gap) until the block ends; yields the values Kafka has acknowledged so far (a value
    counted before its acknowledgement may not be readable yet)."""
    stop, sent = threading.Event(), []

    def send() -> None:
        while not stop.is_set():
            futures, values = [], []
            for _ in range(per):
                value, partition = record(len(sent) + len(values))
                futures.append(producer.send(topic, value=value, partition=partition))
                values.append(value)
            for future in futures:
                future.get(timeout=30)
            sent.extend(values)
            time.sleep(0.05)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        yield sent
    finally:
        stop.set()
        sender.join(10)


def test_a_read_goes_on_while_commands_keep_coming_until_a_gap_or_the_longest_wait(broker):
    """``deferWhileBusyMs``: a read that finds records polls again every ``busyGapMs`` while more
    come, and returns them all once a gap comes, or once it has read that long."""
    topic = new_topic(broker)
    reader = KafkaStreamReader(broker.bootstrap, topic, defer_while_busy_ms=1500, busy_gap_ms=300)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
    try:
        seen, begin, took = read_after_sending(reader, producer, topic, b"lone", partition=0)
        assert seen == [b"lone"]
        assert 0.3 <= took < 1.4  # one gap with nothing new, not the longest wait

        with sending_every_50_ms(producer, topic, lambda n: (f"b{n}".encode(), n % 2)) as sent:
            while not sent:
                time.sleep(0.01)
            started = time.monotonic()
            batches, end = reader.read(begin)
            took = time.monotonic() - started
        seen = values(batches)
        assert 1.4 < took < 3, took  # the longest wait: the burst never paused
        assert len(seen) > 20 and len(set(seen)) == len(seen) and set(seen) <= set(sent)  # many polls' worth
        batches, _ = reader.read(end)
        assert sorted(seen + values(batches)) == sorted(sent)  # the rest of it, once, in the next read
    finally:
        producer.close(timeout=10)
        reader.stop()


def test_only_a_burst_at_the_busy_rate_defers_a_read(broker):
    """``busyRate``: commands slower than it (20 a second here, against 100) are returned at once,
    with no gap waited out, so what waits on the job does not lag behind steady traffic; a stream at
    400 a second is a burst, read on to the longest wait."""
    topic = new_topic(broker)
    reader = KafkaStreamReader(broker.bootstrap, topic, defer_while_busy_ms=1500, busy_gap_ms=300, busy_rate=100)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
    try:
        begin = reader.initialOffset()
        with sending_every_50_ms(producer, topic, lambda n: (f"slow{n}".encode(), n % 2)) as sent:
            while len(sent) < 10:
                time.sleep(0.01)
            started = time.monotonic()
            batches, end = reader.read(begin)
            took = time.monotonic() - started
        assert len(values(batches)) >= 10
        assert took < 0.3, took  # not even one busyGapMs: slow traffic is no burst

        with sending_every_50_ms(producer, topic, lambda n: (f"fast{n}".encode(), n % 2), per=20) as sent:
            while len(sent) < 200:
                time.sleep(0.01)
            started = time.monotonic()
            batches, _ = reader.read(end)
            took = time.monotonic() - started
        assert 1.4 < took < 3, took  # the longest wait: the burst went on at 400 a second
        assert len(values(batches)) > 400
    finally:
        producer.close(timeout=10)
        reader.stop()


def test_the_jobs_own_ticks_do_not_keep_a_read_going(broker):
    """Ticks are not traffic: with a tick every 50 ms, under ``busyGapMs``, a read that found a
    command still stops at the first gap without one, instead of deferring its batch, and the
    expiry the ticks drive, to the longest wait."""
    topic = new_topic(broker)
    reader = KafkaStreamReader(broker.bootstrap, topic, defer_while_busy_ms=1500, busy_gap_ms=300)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
    try:
        with sending_every_50_ms(producer, topic, lambda _: (ev.Tick(time.time_ns() // 1000).to_bytes(), 0)):
            seen, _, took = read_after_sending(reader, producer, topic, b"lone", partition=1)
        assert b"lone" in seen and len(seen) > 1  # the command and the ticks so far
        assert 0.3 <= took < 1.4, took  # one gap with no command, not the longest wait
    finally:
        producer.close(timeout=10)
        reader.stop()


def test_without_deferring_a_record_is_read_as_soon_as_it_is_there(broker):
    topic = new_topic(broker)
    reader = KafkaStreamReader(broker.bootstrap, topic, busy_gap_ms=5000)  # deferWhileBusyMs: 0 by default
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
    try:
        seen, _, took = read_after_sending(reader, producer, topic, b"now", partition=1)
        assert seen == [b"now"]
        assert took < 4  # no wait for a 5 s gap, as a deferring read would
    finally:
        producer.close(timeout=10)
        reader.stop()


def test_the_jobs_reader_reads_a_burst_whole_even_one_larger_than_the_old_batch_limit(broker):
    """As the job configures it (``source_options``, ``source = "python"``), a reader that finds a burst of
    30,000 commands under way returns all of them in one read: a limit of 20,000 started a fan-out's
    first batch while its NOTIFYs were going out, on the cores they needed.

    The burst comes from a process of its own, as a gateway's appends do: a sender thread in this
    process shared the GIL with the reader's decoding, and at half speed it fell under ``busyRate``,
    which ends a burst (it did once in CI: 1,267 of 30,000)."""
    topic = new_topic(broker)
    config = load_config(env={}, kafka={"bootstrap": broker.bootstrap, "commands_topic": topic},
                         streaming={"source": "python"})
    _, options = source_options(config)
    reader = KafkaDataSource(options).simpleStreamReader(KAFKA_RECORD)
    try:
        begin = reader.initialOffset()
        with burst_sender(broker, topic, count=30000, announce_after=2000) as sender:
            batches, end = reader.read(begin)
            assert sender.wait(timeout=60) == 0
        assert sum(batch.num_rows for batch in batches) == 30000
        assert sum(end.values()) == 30000
    finally:
        reader.stop()


_BURST_SENDER = """
import sys
from kafka import KafkaProducer
bootstrap, topic, count, announce_after = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
producer.send(topic, value=b"0", partition=0).get(timeout=30)
sent = []
for i in range(1, count):
    sent.append(producer.send(topic, value=str(i).encode(), partition=i % 2))
    if i == announce_after:
        sent[announce_after // 2].get(timeout=30)
        print("under way", flush=True)
producer.flush(timeout=30)
producer.close(timeout=10)
"""


@contextlib.contextmanager
def burst_sender(broker, topic: str, count: int, announce_after: int):
    """A process that sends ``count`` records to ``topic`` as fast as it can; entered once
    ``announce_after`` are sent and half of them acknowledged (a burst under way, faster than
    ``busyRate``, which a lone first record is not)."""
    process = subprocess.Popen([sys.executable, "-c", _BURST_SENDER, broker.bootstrap, topic, str(count),
                                str(announce_after)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "under way"
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def append_in_order(broker, topic: str, records: list[tuple[int, bytes]]) -> None:
    """``(partition, value)`` in order, each acknowledged before the next is sent."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    try:
        for partition, value in records:
            producer.send(topic, value=value, partition=partition).get(timeout=30)
    finally:
        producer.close(timeout=10)


def values(batches) -> list[bytes]:
    return [value for batch in batches for value in batch.column("value").to_pylist()]


def test_records_reaching_a_partition_that_was_at_its_end_are_read_while_another_moves(broker):
    """Partition 1 at its end while partition 0 moves on: each record appended there later is read
    by the next batches."""
    topic = new_topic(broker)
    append_in_order(broker, topic, [(0, b"publish-0")])
    reader = KafkaStreamReader(broker.bootstrap, topic, catch_up_timeout_ms=500)
    try:
        batches, end = reader.read(reader.initialOffset())
        assert (values(batches), end) == ([b"publish-0"], {"0": 1, "1": 0})
        read = []
        for n in range(1, 4):
            append_in_order(broker, topic, [(0, f"publish-{n}".encode()), (1, f"ack-{n - 1}".encode())])
            batches, end = reader.read(end)
            read += values(batches)
        batches, end = reader.read(end)
        read += values(batches)
        assert sorted(read) == [b"ack-0", b"ack-1", b"ack-2", b"publish-1", b"publish-2", b"publish-3"]
        assert end == {"0": 4, "1": 3}
    finally:
        reader.stop()


def test_missing_topic_is_a_clear_error(broker):
    reader = KafkaStreamReader(broker.bootstrap, f"nope-{uuid.uuid4().hex[:8]}", metadata_timeout_ms=1000)
    try:
        with pytest.raises(KafkaSourceError, match="not found"):
            reader.initialOffset()
    finally:
        reader.stop()


def job_reader(broker, topic: str):
    """The reader as the job configures it (``source_options``, ``source = "python"``)."""
    config = load_config(env={}, kafka={"bootstrap": broker.bootstrap, "commands_topic": topic},
                         streaming={"source": "python"})
    return KafkaDataSource(source_options(config)[1]).simpleStreamReader(KAFKA_RECORD)


def publishes(first: int, count: int) -> list[bytes]:
    return [ev.Publish(first + n, "/q/backlog", f"c{n}", "alice", "ga", 1_000 + n).to_bytes() for n in range(count)]


def read_all(reader) -> list[int]:
    """The sizes of the batches the reader returns until it finds nothing more."""
    sizes, offsets = [], reader.initialOffset()
    while True:
        batches, offsets = reader.read(offsets)
        size = sum(batch.num_rows for batch in batches)
        if not size:
            return sizes
        sizes.append(size)


@pytest.mark.parametrize("before, after, batches", [
    (0, 2_500, [2_000, 501]),  # a REMOVE TOPIC and its backlog: the query routes 2,000, the driver the rest
    (2_200, 300, [2_200, 301]),  # a long simple run first: the batch ends just before the REMOVE TOPIC
    (500, 800, [1_301]),  # within the bound: one batch
])
def test_a_batch_the_routing_query_must_route_ends_soon_after_its_removal(broker, before, after, batches):
    """A REMOVE TOPIC (which the routing query routes, in time growing with its rows) arriving with a
    backlog does not make the whole backlog one batch for that query (``max_records_per_query_batch``,
    2,000): a lone drain's first batch took 54 s so, and 100,000 rows once ran the driver out of heap."""
    topic = new_topic(broker, partitions=1)
    produce(broker, topic, publishes(1, before) + [ev.RemoveTopic("r", "admin", "/q/other", 999).to_bytes()]
            + publishes(before + 1, after), partitions=1)
    reader = job_reader(broker, topic)
    try:
        assert read_all(reader) == batches
    finally:
        reader.stop()


@pytest.mark.parametrize("since", [None, 1])
def test_a_backlog_of_publishes_and_subscribes_is_still_read_in_one_batch(broker, since):
    """SUBSCRIBEs, those whose SINCE clears too, are routed on the driver: they do not end a batch."""
    topic = new_topic(broker, partitions=1)
    produce(broker, topic, publishes(1, 1_000) + [ev.Subscribe("bob", "gb", "/q/backlog", 999, since).to_bytes()]
            + publishes(1_001, 1_499), partitions=1)
    reader = job_reader(broker, topic)
    try:
        assert read_all(reader) == [2_500]
    finally:
        reader.stop()


def test_a_removal_a_later_poll_of_the_same_read_brings_still_ends_the_batch():
    """While a burst is deferred, ``kept`` grows poll by poll and the reader asks after each where the
    batch ends; it scans only what the last poll added, and must still find a REMOVE TOPIC there after
    earlier polls brought none (no broker: the reader's cut alone, on records as Kafka gives them)."""
    config = load_config(env={}, kafka={"bootstrap": "127.0.0.1:9", "commands_topic": "unused"},
                         streaming={"source": "python"})
    reader = KafkaDataSource(source_options(config)[1]).simpleStreamReader(KAFKA_RECORD)
    kept = [SimpleNamespace(value=value) for value in publishes(1, 2_100)]
    scan = _QueryCommandScan()
    assert reader._query_batch_end(kept, scan) == 2_100
    kept += [SimpleNamespace(value=None), SimpleNamespace(value=ev.RemoveTopic("r", "admin", "/q/other", 999).to_bytes())]
    kept += [SimpleNamespace(value=value) for value in publishes(2_101, 50)]
    assert reader._query_batch_end(kept, scan) == 2_101  # just before the REMOVE TOPIC
    kept.append(SimpleNamespace(value=ev.Nack("bob", "gb", 1, 1_001, 5).to_bytes()))
    assert reader._query_batch_end(kept, scan) == 2_101
