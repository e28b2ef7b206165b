"""The ``smqp_kafka`` source against the real dev broker (tansu) and real Spark."""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
import uuid

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from schemas import events as ev
from schemas.config import load_config
from schemas.events import AFTER_HEADER
from schemas.spark import KAFKA_RECORD
from streaming.job import source_options
from streaming.kafka_source import KafkaDataSource, KafkaSourceError, KafkaStreamReader

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
def sending_every_50_ms(producer, topic: str, record):
    """From a thread, sends ``record(n)``, a (value, partition), every 50 ms (never a 300 ms gap)
    until the block ends; yields the values sent so far."""
    stop, sent = threading.Event(), []

    def send() -> None:
        while not stop.is_set():
            value, partition = record(len(sent))
            producer.send(topic, value=value, partition=partition).get(timeout=30)
            sent.append(value)
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
    """As the job configures it by default (``source_options``), a reader that finds a burst of
    30,000 commands returns all of them in one read: a limit of 20,000 started a fan-out's first
    batch while its NOTIFYs were going out, on the cores they needed."""
    topic = new_topic(broker)
    config = load_config(env={}, kafka={"bootstrap": broker.bootstrap, "commands_topic": topic})
    _, options = source_options(config)
    reader = KafkaDataSource(options).simpleStreamReader(KAFKA_RECORD)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
    try:
        begin = reader.initialOffset()
        producer.send(topic, value=b"0", partition=0).get(timeout=30)
        sender = threading.Thread(target=lambda: [producer.send(topic, value=str(i).encode(), partition=i % 2)
                                                  for i in range(1, 30000)])
        sender.start()
        batches, end = reader.read(begin)
        sender.join(30)
        producer.flush(timeout=30)
        assert sum(batch.num_rows for batch in batches) == 30000
        assert sum(end.values()) == 30000
    finally:
        producer.close(timeout=10)
        reader.stop()


def append_acks_and_publishes(broker, topic: str, records: list[tuple[int, bytes, int | None]]) -> None:
    """``(partition, value, after)`` in order, each acknowledged before the next is sent (as a
    gateway appends an ACK only after its publish was durable); ``after`` is the ACK's header."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    try:
        for partition, value, after in records:
            headers = [] if after is None else [(AFTER_HEADER, str(after).encode())]
            producer.send(topic, value=value, partition=partition, headers=headers).get(timeout=30)
    finally:
        producer.close(timeout=10)


def values(batches) -> list[bytes]:
    return [value for batch in batches for value in batch.column("value").to_pylist()]


def test_an_ack_is_read_only_by_a_batch_that_reads_its_publish_and_acks_keep_their_order(broker):
    """With ``ackPartition``, a record there whose ``smqp.after`` lies past what the batch reads
    of partition 0 waits for a later batch, and every ACK after it waits too: the job never sees
    an ACK before its publish (it would settle nothing, and the delivery stay pending for good)."""
    topic = new_topic(broker)
    append_acks_and_publishes(broker, topic, [(0, b"publish-0", None), (0, b"publish-1", None),
                                              (1, b"ack-of-publish-3", 4), (1, b"ack-of-publish-0", 1)])
    reader = KafkaStreamReader(broker.bootstrap, topic, ack_partition=1, catch_up_timeout_ms=500)
    try:
        batches, end = reader.read(reader.initialOffset())
        assert (values(batches), end) == ([b"publish-0", b"publish-1"], {"0": 2, "1": 0})
        batches, again = reader.read(end)  # nothing new in partition 0: the ACKs still wait
        assert (values(batches), again) == ([], end)

        append_acks_and_publishes(broker, topic, [(0, b"publish-2", None), (0, b"publish-3", None)])
        batches, end = reader.read(end)
        assert sorted(values(batches)) == [b"ack-of-publish-0", b"ack-of-publish-3", b"publish-2", b"publish-3"]
        assert end == {"0": 4, "1": 2}
        batches, again = reader.read(end)
        assert (values(batches), again) == ([], end)
    finally:
        reader.stop()


def test_held_acks_survive_batches_cut_short_by_the_limit_and_come_once_in_order(broker):
    """ACKs marked to follow partition-0 records not there yet (a gateway's fold had read two more,
    say, ticks, than this read sees): batches of 4 read partition 0 and leave every ACK, again and
    again; once partition 0 reaches the mark the ACKs come, each once, in their order."""
    topic = new_topic(broker)
    append_acks_and_publishes(broker, topic, [(0, f"publish-{n}".encode(), None) for n in range(10)]
                              + [(1, f"ack-{n}".encode(), 12) for n in range(6)])
    reader = KafkaStreamReader(broker.bootstrap, topic, ack_partition=1, max_records=4, catch_up_timeout_ms=500)
    try:
        read, start = [], reader.initialOffset()

        def read_batches(count: int) -> None:
            nonlocal start
            for _ in range(count):
                batches, start = reader.read(start)
                batch = values(batches)
                assert len(batch) <= 4  # the limit holds, held ACKs released or not
                read.extend(batch)

        read_batches(6)
        assert (read, start) == ([f"publish-{n}".encode() for n in range(10)], {"0": 10, "1": 0})

        append_acks_and_publishes(broker, topic, [(0, b"tick-10", None), (0, b"tick-11", None)])
        read_batches(6)
        assert read[10:] == [b"tick-10", b"tick-11"] + [f"ack-{n}".encode() for n in range(6)]
        assert start == {"0": 12, "1": 6}
    finally:
        reader.stop()


def test_acks_held_while_partition_0_streams_in_are_read_once_it_gets_there(broker):
    """A long partition 0 read a few hundred records a batch, its ACKs all marked to follow its
    end: they are held batch after batch, each time read again from the first held, and come as
    soon as a batch reads partition 0 to its end."""
    topic = new_topic(broker)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
    try:
        for n in range(4000):
            producer.send(topic, value=b"publish-%d" % n, partition=0)
        producer.flush(timeout=60)
        for n in range(100):
            producer.send(topic, value=b"ack-%d" % n, partition=1, headers=[(AFTER_HEADER, b"4000")])
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)
    reader = KafkaStreamReader(broker.bootstrap, topic, ack_partition=1, max_records=300, catch_up_timeout_ms=500)
    try:
        acks, start = [], reader.initialOffset()
        for _ in range(40):
            batches, end = reader.read(start)
            batch_acks = [v for v in values(batches) if v.startswith(b"ack-")]
            assert not batch_acks or end["0"] == 4000
            acks += batch_acks
            start = end
            if end == {"0": 4000, "1": 100}:
                break
        assert (start, acks) == ({"0": 4000, "1": 100}, [b"ack-%d" % n for n in range(100)])
    finally:
        reader.stop()


def test_each_read_of_a_backlog_takes_megabytes_of_partition_0_beside_the_acks_partition(broker):
    """A job behind by 20,000 publishes of 650 bytes reads them in a few large batches, not in the
    1 MiB a partition that kafka-python fetches by default (with a second partition in the fetch,
    the dev broker keeps to it: ~1,600 publishes a batch, and a batch costs seconds of Spark)."""
    topic = new_topic(broker)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5)
    try:
        for _ in range(20000):
            producer.send(topic, value=b"x" * 650, partition=0)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)
    reader = KafkaStreamReader(broker.bootstrap, topic, ack_partition=1)
    try:
        start, sizes = reader.initialOffset(), []
        for _ in range(3):
            _, end = reader.read(start)
            sizes.append(end["0"] - start["0"])
            start = end
        assert min(sizes[:2]) > 4000, sizes
    finally:
        reader.stop()


def test_records_reaching_a_partition_that_was_at_its_end_are_read_while_another_moves(broker):
    """The ACKs' partition at its end while partition 0 moves on: each ACK appended later is read by
    the next batches, with its publish."""
    topic = new_topic(broker)
    append_acks_and_publishes(broker, topic, [(0, b"publish-0", None)])
    reader = KafkaStreamReader(broker.bootstrap, topic, ack_partition=1, catch_up_timeout_ms=500)
    try:
        batches, end = reader.read(reader.initialOffset())
        assert (values(batches), end) == ([b"publish-0"], {"0": 1, "1": 0})
        read = []
        for n in range(1, 4):
            append_acks_and_publishes(broker, topic, [(0, f"publish-{n}".encode(), None),
                                                      (1, f"ack-{n - 1}".encode(), n)])
            batches, end = reader.read(end)
            read += values(batches)
        batches, end = reader.read(end)
        read += values(batches)
        assert sorted(read) == [b"ack-0", b"ack-1", b"ack-2", b"publish-1", b"publish-2", b"publish-3"]
        assert end == {"0": 4, "1": 3}
    finally:
        reader.stop()


def test_a_deferring_read_leaves_the_acks_partition_to_the_end_and_its_acks_keep_it_going(broker):
    """While a read defers, only the command partitions are fetched; ACKs still coming keep it
    going (their partition's end is asked), and once they stop the read takes them all in one go,
    in order, with the publish they follow."""
    topic = new_topic(broker)
    append_acks_and_publishes(broker, topic, [(0, b"publish-0", None)])
    reader = KafkaStreamReader(broker.bootstrap, topic, ack_partition=1, defer_while_busy_ms=3000,
                               busy_gap_ms=300, catch_up_timeout_ms=1000)
    polled, poll = [], reader._poll
    reader._poll = lambda consumer, partitions, *rest: (polled.append(list(partitions)), poll(consumer, partitions, *rest))
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
    try:
        begin = reader.initialOffset()
        ack = lambda n: (f"ack-{n}".encode(), 1)  # noqa: E731
        with sending_every_50_ms(producer, topic, ack) as sent:
            while len(sent) < 2:
                time.sleep(0.01)
            stop_at = time.monotonic() + 0.8
            batches, end = [], None
            reading = threading.Thread(target=lambda: batches.append(reader.read(begin)))
            reading.start()
            while time.monotonic() < stop_at:
                time.sleep(0.01)
        reading.join(10)
        [(read, end)] = batches
        seen = values(read)
        assert seen == [b"publish-0"] + sent, seen  # every ACK, in order: they kept the read going
        assert end == {"0": 1, "1": len(sent)}
        assert polled[0] == [0, 1] and polled[-1] == [0, 1] and len(polled) > 3
        assert all(partitions == [0] for partitions in polled[1:-1]), polled  # no ACK fetched meanwhile
    finally:
        producer.close(timeout=10)
        reader.stop()


def test_an_ack_held_for_its_publish_comes_in_the_same_read_once_the_burst_brought_it(broker):
    """An ACK whose publish the read had not reached yet is read again once the burst is over:
    partition 0 has come that far meanwhile, so the batch holds both (not the next one)."""
    topic = new_topic(broker)
    append_acks_and_publishes(broker, topic, [(0, b"publish-0", None), (1, b"ack-of-publish-4", 5)])
    reader = KafkaStreamReader(broker.bootstrap, topic, ack_partition=1, defer_while_busy_ms=3000,
                               busy_gap_ms=300, catch_up_timeout_ms=500)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)

    def publish_after_the_first_poll() -> None:
        time.sleep(0.15)
        for n in range(1, 5):
            producer.send(topic, value=f"publish-{n}".encode(), partition=0).get(timeout=30)
            time.sleep(0.05)

    try:
        begin = reader.initialOffset()
        sender = threading.Thread(target=publish_after_the_first_poll)
        sender.start()
        batches, end = reader.read(begin)
        sender.join(10)
        assert values(batches) == [f"publish-{n}".encode() for n in range(5)] + [b"ack-of-publish-4"]
        assert end == {"0": 5, "1": 1}
    finally:
        producer.close(timeout=10)
        reader.stop()


def test_missing_topic_is_a_clear_error(broker):
    reader = KafkaStreamReader(broker.bootstrap, f"nope-{uuid.uuid4().hex[:8]}", metadata_timeout_ms=1000)
    try:
        with pytest.raises(KafkaSourceError, match="not found"):
            reader.initialOffset()
    finally:
        reader.stop()
