"""The gateway's Kafka edges against the real dev broker: appends batched by the event loop come
back durable, in order, with their offsets; tails read them from the start; an append Kafka
cannot take fails once its delivery timeout has passed."""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.record.memory_records import MemoryRecords

from deploy.broker import DevBroker
from gateway.kafka_io import (FETCH_VERSION, Appended, Cluster, DurableLog, Tail, deliveries_tail, next_wait_ms,
                              read_acks_since)
from schemas.config import KafkaConfig
from schemas.events import Ack, Sync
from tests.conftest import kafka_config


def _config(bootstrap: str, partitions: int = 1, **kafka) -> KafkaConfig:
    return kafka_config(bootstrap, commands_partitions=partitions, **kafka)


async def _read_all(config: KafkaConfig, cluster: Cluster) -> list[tuple[int, bytes, bytes]]:
    """Every record of the commands topic, read by a :class:`Tail` until it is ready."""
    records = []
    reader = Tail(config, cluster, config.commands_topic, records.extend,
                  lambda offset, key, value: (offset, key, value))
    reader.start()
    try:
        await asyncio.wait_for(reader.ready.wait(), 30)
    finally:
        await reader.stop()
    return records


def test_concurrent_appends_share_requests_and_come_back_in_order_with_their_offsets(broker):
    config = _config(broker.bootstrap)

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        try:
            values = [f"record {i}".encode() for i in range(3000)]
            appended = []
            for chunk in range(0, len(values), 500):  # bursts, as pipelining clients send them
                appended += await asyncio.gather(*(log.append(b"key", v) for v in values[chunk:chunk + 500]))
            assert appended == [Appended(0, offset) for offset in range(3000)]
            records = await _read_all(config, cluster)
            assert [(offset, value) for offset, _, value in records] == list(enumerate(values))
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())


async def _stored_batches(config: KafkaConfig, cluster: Cluster) -> list[list[bytes]]:
    """Commands partition 0 as the broker stores it: the values of each record batch (one per
    produce request)."""
    connection = await cluster.leader(config.commands_topic, 0, "test")
    fetch = FetchRequest.FetchTopic
    request = FetchRequest(replica_id=-1, max_wait_ms=1000, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                           max_version=FETCH_VERSION, topics=[fetch(topic=config.commands_topic, partitions=[
                               fetch.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])])
    response = await connection.call(request, 30)
    records = MemoryRecords(response.responses[0].partitions[0].records or b"")
    batches = []
    while (batch := records.next_batch()) is not None:
        batches.append([record.value for record in batch])
    return batches


def _appending_apart(broker, linger_flags: list[bool], **kafka) -> tuple[list[list[bytes]], float]:
    """Appends ``record i`` for each flag (its ``linger``), 20 ms apart, to a new topic; returns
    the batches stored and the seconds until the last append was durable."""
    config = _config(broker.bootstrap, **kafka)

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        try:
            await log.append(b"", b"warm-up")  # the connection is open before the clock starts
            started, futures = time.monotonic(), []
            for i, linger in enumerate(linger_flags):
                futures.append(log.append(b"", f"record {i}".encode(), linger=linger))
                await asyncio.sleep(0.02)
            await asyncio.gather(*futures)
            return (await _stored_batches(config, cluster))[1:], time.monotonic() - started
        finally:
            await log.close()
            cluster.close()

    return asyncio.run(scenario())


def test_appends_that_may_linger_share_one_request_within_linger_ms(broker):
    batches, _ = _appending_apart(broker, [True] * 4, linger_ms=2000)
    assert batches == [[b"record 0", b"record 1", b"record 2", b"record 3"]]


def test_an_append_that_may_not_linger_goes_at_once_and_takes_the_lingering_ones_along(broker):
    # a lone PUB or a window-1 ACK: its client waits on this append alone
    batches, seconds = _appending_apart(broker, [True, True, False], linger_ms=10000)
    assert batches == [[b"record 0", b"record 1", b"record 2"]]
    assert seconds < 5  # not held for the 10 s linger
    batches, _ = _appending_apart(broker, [False, False, False], linger_ms=10000)
    assert batches == [[b"record 0"], [b"record 1"], [b"record 2"]]


def test_lingering_appends_leave_once_batch_bytes_wait_not_a_linger_later(broker):
    """Kafka's ``batch.size``: a publisher keeping a window of PUBs in flight fills a request
    before the linger ends; waiting it out would add the linger to every round trip."""
    record = len(b"record 0")
    batches, seconds = _appending_apart(broker, [True] * 4, linger_ms=10000, batch_bytes=2 * record)
    assert batches == [[b"record 0", b"record 1"], [b"record 2", b"record 3"]]
    assert seconds < 5  # not held for the 10 s linger


def test_keyed_appends_land_on_the_partition_kafkas_default_partitioner_picks(broker):
    """Same key, same partition (what orders a topic's publishes and an account's ACKs), as Kafka's
    Java client and kafka-python place them (murmur2)."""
    from kafka.partitioner.default import murmur2

    config = _config(broker.bootstrap, partitions=3)

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        try:
            for key in (b"/a/b", b"bob", b"alice", b"/stocks/ibm") * 2:  # the second time from its memory
                place = await log.append(key, b"x")
                assert place.partition == (murmur2(key) & 0x7FFFFFFF) % 3
            assert (await log.append(b"bob", b"y", partition=0)).partition == 0
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())


def test_an_append_kafka_cannot_take_fails_after_the_delivery_timeout():
    with DevBroker() as own:
        config = _config(own.bootstrap, delivery_timeout_ms=1500)

        async def scenario():
            cluster = Cluster(config)
            log = await DurableLog.open(config, cluster)
            try:
                await log.append(None, b"before")
                own.stop()
                started = time.monotonic()
                with pytest.raises(Exception) as failed:
                    await asyncio.wait_for(log.append(None, b"lost"), 30)
                waited = time.monotonic() - started
                assert not isinstance(failed.value, asyncio.TimeoutError)
                assert 1.0 <= waited <= 8, waited
            finally:
                await log.close(timeout=1)
                cluster.close()

        asyncio.run(scenario())


def test_acks_since_the_jobs_progress_are_read_back_at_start(broker):
    config = _config(broker.bootstrap)

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        try:
            early = await log.append(b"bob", Ack("bob", "g", 1, 0).to_bytes())
            await log.append(b"", Sync("s").to_bytes(), partition=0)
            await log.append(b"bob", Ack("bob", "g", 2, 0).to_bytes())
            acks = await read_acks_since(config, cluster, {"0": early.offset + 1})
            assert [ack.smuid for ack in acks] == [2]
            assert [ack.smuid for ack in await read_acks_since(config, cluster, {})] == [1, 2]
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())


def test_a_tail_far_behind_catches_up_although_the_broker_cannot_gather_a_fetch_within_its_wait(broker):
    """The dev broker answers a fetch empty when gathering its records takes longer than the fetch's
    max wait (it grows with the record batches it holds): a tail behind 10,000 small batches with a
    1 ms wait must still read everything, not ask forever."""
    config = _config(broker.bootstrap, fetch_max_wait_ms=1)
    values = [f"record {i:06d}".encode() for i in range(30_000)]

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        try:
            for chunk in range(0, len(values), 3):  # a batch per request, as a lightly loaded gateway appends
                await asyncio.gather(*(log.append(None, v) for v in values[chunk:chunk + 3]))
            read = []
            reader = Tail(config, cluster, config.commands_topic, read.extend, lambda offset, key, value: value)
            reader.start()
            try:
                await asyncio.wait_for(reader.ready.wait(), 60)
                for _ in range(500):  # caught up: the next fetch finds nothing more and waits as configured
                    if reader.max_wait_ms == 1:
                        break
                    await asyncio.sleep(0.01)
                assert reader.max_wait_ms == 1
            finally:
                await reader.stop()
            assert read == values
        finally:
            await log.close()
            cluster.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("current, got_records, behind, expected", [
    (10, False, True, 20),     # answered empty for lack of time: wait longer
    (4000, False, True, 5000),  # up to a bound
    (0, False, True, 1),       # from a zero wait too
    (80, True, True, 40),      # records came: back towards the configured wait
    (12, True, False, 10),     # never under it
    (640, False, False, 10),   # idle: the configured wait, the next record's latency
])
def test_the_fetch_wait_grows_while_the_broker_answers_late_and_returns_once_it_does_not(
        current, got_records, behind, expected):
    configured = 0 if current == 0 else 10
    assert next_wait_ms(current, configured, got_records, behind) == expected


def test_a_caught_up_tail_pauses_after_reading_records_unless_someone_waits_for_them(broker):
    """After a fetch that brought records, a tail at the end waits before asking again (a multiple
    of that fetch's duration, at most 0.5 s: each such fetch costs the dev broker a walk over the
    partition), so a record appended meanwhile is read late; a nudge, as the gateway gives when it
    waits for its own control event, ends the pause at once."""
    config = _config(broker.bootstrap, fetch_max_wait_ms=10, tail_pause_factor=1_000_000)

    async def scenario():
        cluster = Cluster(config)
        log = await DurableLog.open(config, cluster)
        arrived: dict[bytes, float] = {}
        reader = Tail(config, cluster, config.commands_topic,
                      lambda values: arrived.update((v, time.monotonic()) for v in values),
                      lambda offset, key, value: value)
        reader.start()

        async def read_after_append(value: bytes, nudge: bool) -> float:
            appended = time.monotonic()
            await log.append(None, value)
            if nudge:
                reader.nudge()
            for _ in range(300):
                if value in arrived:
                    return arrived[value] - appended
                await asyncio.sleep(0.01)
            raise AssertionError(f"{value!r} not read within 3 s")

        try:
            await asyncio.wait_for(reader.ready.wait(), 30)
            await read_after_append(b"first", nudge=False)
            paused = await read_after_append(b"during the pause", nudge=False)
            nudged = await read_after_append(b"nudged", nudge=True)
            return paused, nudged
        finally:
            await reader.stop()
            await log.close()
            cluster.close()

    paused, nudged = asyncio.run(scenario())
    assert 0.3 < paused < 1.0
    assert nudged < 0.2


def test_the_deliveries_tail_idles_at_its_own_longer_fetch_wait(broker):
    """The deliveries topic is off the NOTIFY path of what a gateway routes itself, so its tail
    asks the broker less often while idle (each fetch costs the dev broker a walk over the
    partition); the commands tail keeps the short wait that bounds routing latency."""
    config = _config(broker.bootstrap, fetch_max_wait_ms=10, deliveries_fetch_max_wait_ms=300)

    async def scenario():
        cluster = Cluster(config)
        tail = deliveries_tail(config, cluster, lambda items: None)
        tail.start()
        try:
            await asyncio.wait_for(tail.ready.wait(), 30)
            await asyncio.sleep(1.0)  # a few idle fetches
            return tail.max_wait_ms
        finally:
            await tail.stop()
            cluster.close()

    assert asyncio.run(scenario()) == 300
